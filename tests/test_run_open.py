"""``Run.open``: the run's stores opened and closed off the event loop, and what happens when
one of them cannot open or cannot close.

Real parts: SQLite stores and the JSONL sink in a temporary folder, a Redis URL whose port
nothing listens on (the frontier cannot open), a JSONL compaction that fails (its temporary
file is a directory). The run loop's own calls are checked by tests/test_offloop.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import pytest

from collector.config import load_source
from collector.errors import BackendError
from collector.run.collection import Run
from collector.sinks import JsonlSink, SinkRecord
from tests.helpers import sink_lines, write_source


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open_files(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open (Linux: /proc/self/fd)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                found.append(target)
    return found


def test_a_store_that_cannot_open_closes_the_others_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTOR_REDIS_RECONNECT_S", "0.2")
    url = f"redis://127.0.0.1:{_free_port()}/0"
    source = load_source(
        write_source(tmp_path, seeds={"urls": ["https://example.test/1"]},
                     frontier={"type": "redis", "url": url})
    )  # fmt: skip

    async def go() -> None:
        async with Run.open(source, run_id="r1"):
            raise AssertionError("the run opened without its frontier")

    with pytest.raises(BackendError) as caught:
        asyncio.run(go())
    assert "\n" not in str(caught.value) and "127.0.0.1" in str(caught.value)
    # the stores that did open (the sink, the dead letters) were closed again: no file of the
    # source's folder is open any more, though the error (and its frames) is still held
    assert _open_files(tmp_path) == []


def test_a_close_that_fails_is_said_and_loses_nothing(tmp_path: Path) -> None:
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://example.test/1"]}))
    blocker = tmp_path / "unset"

    async def go() -> None:
        async with Run.open(source, run_id="r1") as run:
            for n in (1, 2):  # a superseded line: the close compacts it
                record = SinkRecord("k1", {"id": "k1", "n": n}, "https://example.test/1")
                await run.stores.sink.write([record], token=n, batch_id=f"b{n}")
            segment = next(source.sink_path.glob("*.jsonl"))
            nonlocal blocker
            blocker = segment.with_suffix(".jsonl.tmp")
            blocker.mkdir()  # the compaction's temporary file: it cannot be written
            summary = await run.end(planned=False, role="work")
            assert summary.records_in_sink == 1

    with pytest.raises(BackendError, match="closing the run's stores failed: sink: "):
        asyncio.run(go())
    blocker.rmdir()  # nothing was lost: the next open compacts, one line per key
    JsonlSink(source.sink_path, source=source.name).close()
    assert [row["n"] for row in sink_lines(source.sink_path)] == [2]


def test_a_run_opened_with_open_reaches_its_stores_only_off_the_loop(tmp_path: Path) -> None:
    """The stores themselves stay for the tools that open a run synchronously; a run opened
    with ``Run.open`` has only ``run.stores``, and its summary is read by ``Run.end``."""
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://example.test/1"]}))

    async def go() -> None:
        async with Run.open(source, run_id="r1") as run:
            for reach in (lambda: run.frontier, lambda: run.sink, lambda: run.deadletters):
                with pytest.raises(RuntimeError, match=r"through run\.stores"):
                    reach()
            with pytest.raises(RuntimeError, match=r"Run\.end reads them"):
                run.summary()
            assert (await run.stores.frontier.counts(source.name)).total == 0
            assert (await run.end(planned=False, role="work")).records_in_sink == 0

    asyncio.run(go())
    with Run(source, run_id="r2") as run:  # the synchronous way keeps the stores in reach
        assert run.frontier.counts(source.name).total == 0
