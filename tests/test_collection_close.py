"""A run whose stores fail to close says so, and still closes the others.

The JSONL sink compacts its segments when it closes (a record written again leaves its older
line superseded); ``Collection.close`` used to swallow any error there, so a run whose output
could not be compacted ended as if all was well. The failure here is a real one: the temporary
file the compaction writes is a directory.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from collector.config import load_source
from collector.errors import BackendError
from collector.run.collection import Collection
from collector.sinks import JsonlSink, SinkRecord
from tests.helpers import sink_lines, write_source


def _superseded_line(run: Collection) -> Path:
    """Write key k1 twice with different content (the first line is superseded); returns the
    path the compaction of its segment writes to, made a directory so that it fails."""
    for n in (1, 2):
        record = SinkRecord("k1", {"id": "k1", "n": n}, "https://example.test/1")
        run.sink.write([record], token=n, batch_id=f"b{n}")
    segment = next(run.source.sink_path.glob("*.jsonl"))
    blocker = segment.with_suffix(".jsonl.tmp")
    blocker.mkdir()
    return blocker


def test_a_sink_that_cannot_compact_fails_the_close_after_closing_the_rest(
    tmp_path: Path,
) -> None:
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://example.test/1"]}))
    run = Collection(source, run_id="r1")
    blocker = _superseded_line(run)
    with pytest.raises(BackendError) as caught:
        run.close()
    message = str(caught.value)
    assert message.startswith("test-items: closing the run's stores failed: sink: ")
    assert "IsADirectoryError" in message and "\n" not in message
    assert isinstance(caught.value.__cause__, IsADirectoryError)
    for closed in (run.frontier, run.deadletters):  # closed although the sink failed first
        with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
            closed.counts("test-items")
    blocker.rmdir()  # nothing was lost: the next open compacts, one line per key
    JsonlSink(source.sink_path, source=source.name).close()
    assert [row["n"] for row in sink_lines(source.sink_path)] == [2]


def test_a_run_failing_anyway_keeps_its_own_error_and_notes_the_close(tmp_path: Path) -> None:
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://example.test/1"]}))
    with (
        pytest.raises(RuntimeError, match="the run's own failure") as caught,
        Collection(source, run_id="r1") as run,
    ):
        _superseded_line(run)
        raise RuntimeError("the run's own failure")
    notes = getattr(caught.value, "__notes__", [])
    assert len(notes) == 1 and "closing the run's stores failed: sink: " in notes[0]


def test_a_clean_close_raises_nothing(tmp_path: Path) -> None:
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://example.test/1"]}))
    with Collection(source, run_id="r1") as run:
        for n in (1, 2):
            record = SinkRecord("k1", {"id": "k1", "n": n}, "https://example.test/1")
            run.sink.write([record], token=n, batch_id=f"b{n}")
    assert [row["n"] for row in sink_lines(source.sink_path)] == [2]  # compacted
