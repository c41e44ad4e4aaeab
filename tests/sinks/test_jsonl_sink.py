"""JSONL sink: the conformance suite plus what only the file format has (segments, compaction,
torn lines, a writer killed mid-way)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import collector.sinks.jsonl as jsonl_module
from collector.errors import BackendError
from collector.sinks.base import Sink
from collector.sinks.jsonl import JsonlSink

from .conformance import SinkConformance, rec, result

SOURCE = "items"
NAME = re.compile(r"^(items-\d{5}\.jsonl|\.items\.lock)$")  # segments, and the writer lock


class TestJsonlSink(SinkConformance):
    @pytest.fixture
    def opened(self, tmp_path: Path) -> Iterator[Callable[[], Sink]]:
        instances: list[JsonlSink] = []

        def open_sink() -> Sink:
            if instances:
                instances[-1].close()
            instances.append(JsonlSink(tmp_path / "out", source=SOURCE))
            return instances[-1]

        yield open_sink
        instances[-1].close()

    @pytest.fixture
    def sink(self, opened: Callable[[], Sink]) -> Sink:
        return opened()

    @pytest.fixture
    def reopen(self, opened: Callable[[], Sink], sink: Sink) -> Callable[[], Sink]:
        return opened


# --- helpers -------------------------------------------------------------------------------------
def segment_files(folder: Path, source: str = SOURCE) -> list[Path]:
    pattern = re.compile(rf"^{re.escape(source)}-\d{{5}}\.jsonl$")
    return sorted(p for p in folder.iterdir() if pattern.match(p.name))


def lines(folder: Path, source: str = SOURCE) -> list[dict[str, Any]]:
    """Every line of every segment of ``source``, parsed (fails on a line that is not JSON)."""
    rows: list[dict[str, Any]] = []
    for path in segment_files(folder, source):
        data = path.read_bytes()
        assert data == b"" or data.endswith(b"\n"), f"{path.name}: torn last line"
        rows.extend(json.loads(line) for line in data.splitlines())
    return rows


def duplicate_keys(rows: list[dict[str, Any]]) -> list[str]:
    seen = Counter(row["_collector"]["key"] for row in rows)
    return sorted(key for key, n in seen.items() if n > 1)


def open_sink(folder: Path, source: str = SOURCE) -> JsonlSink:
    return JsonlSink(folder, source=source)


# --- file format ---------------------------------------------------------------------------------
def test_files_are_source_segments_of_collector_lines(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "out"  # created on open
    sink = open_sink(folder)
    sink.write([rec("a", v=1), rec("b", v=2)], token=7, batch_id="batch-7")
    sink.write([rec("c", v=3)], token=8, batch_id="batch-8")
    sink.close()
    assert sink.location() == str(folder)
    names = [p.name for p in folder.iterdir()]
    assert names
    assert all(NAME.match(n) for n in names), names
    rows = lines(folder)
    assert [row["_collector"]["key"] for row in rows] == ["a", "b", "c"]
    for row in rows:
        meta = row["_collector"]
        assert set(meta) >= {"key", "token", "batch", "url", "stored_at"}
        assert meta["url"] == f"https://example.test/{meta['key']}"
        assert isinstance(meta["stored_at"], float)
    assert [(r["_collector"]["token"], r["_collector"]["batch"]) for r in rows] == [
        (7, "batch-7"),
        (7, "batch-7"),
        (8, "batch-8"),
    ]
    assert rows[0]["id"] == "a"
    assert rows[0]["v"] == 1


def test_unchanged_and_stale_writes_append_nothing(tmp_path: Path) -> None:
    sink = open_sink(tmp_path)
    sink.write([rec("a", v=1)], token=5, batch_id="b1")
    (path,) = segment_files(tmp_path)
    before = path.read_bytes()
    assert sink.write([rec("a", v=1)], token=6, batch_id="b2") == result(unchanged=1)
    assert sink.write([rec("a", v=2)], token=4, batch_id="b3") == result(stale_keys=["a"])
    assert path.read_bytes() == before
    sink.close()
    assert path.read_bytes() == before


def test_no_key_on_two_lines_after_close_and_after_reopen(tmp_path: Path) -> None:
    sink = open_sink(tmp_path)
    for token in range(1, 6):
        sink.write([rec(f"k{i}", v=token) for i in range(10)], token=token, batch_id=f"b{token}")
    assert duplicate_keys(lines(tmp_path))  # before compaction, old versions are still there
    sink.close()
    rows = lines(tmp_path)
    assert duplicate_keys(rows) == []
    assert {row["_collector"]["key"]: row["v"] for row in rows} == {f"k{i}": 5 for i in range(10)}
    again = open_sink(tmp_path)
    assert duplicate_keys(lines(tmp_path)) == []
    assert again.count() == 10
    assert again.get("k3") == {"id": "k3", "v": 5}
    again.write([rec("k3", v=6)], token=6, batch_id="b6")
    again.close()
    assert duplicate_keys(lines(tmp_path)) == []
    third = open_sink(tmp_path)
    assert third.get("k3") == {"id": "k3", "v": 6}
    third.close()


def test_duplicates_left_by_a_crash_are_compacted_on_open(tmp_path: Path) -> None:
    crashed = open_sink(tmp_path)
    crashed.write([rec("a", v=1), rec("b", v=1)], token=1, batch_id="b1")
    crashed.write([rec("a", v=2)], token=2, batch_id="b2")
    # no close(): as if the process died here
    assert duplicate_keys(lines(tmp_path)) == ["a"]
    reopened = open_sink(tmp_path)
    try:
        assert duplicate_keys(lines(tmp_path)) == []
        assert reopened.get("a") == {"id": "a", "v": 2}
        assert reopened.get("b") == {"id": "b", "v": 1}
        assert reopened.count() == 2
    finally:
        reopened.close()
        assert crashed._handle is not None
        crashed._handle.close()  # the dead process's file handle (close() would compact)


def test_a_close_whose_compaction_fails_still_lets_go_of_the_writer_lock(tmp_path: Path) -> None:
    """The close raises, and another writer may open the sink at once: the lock file takes a
    new flock (an open file of its own: in this process too, flock is per open file)."""
    import fcntl

    sink = open_sink(tmp_path)
    sink.write([rec("a", v=1)], token=1, batch_id="b1")
    sink.write([rec("a", v=2)], token=2, batch_id="b2")  # a superseded line: close compacts
    (segment,) = segment_files(tmp_path)
    blocker = segment.with_suffix(".jsonl.tmp")
    blocker.mkdir()  # the compaction's temporary file cannot be written
    with pytest.raises(IsADirectoryError):
        sink.close()
    with (tmp_path / f".{SOURCE}.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while still held
        fcntl.flock(lock, fcntl.LOCK_UN)
    blocker.rmdir()
    reopened = open_sink(tmp_path)  # nothing lost: the open compacts, one line per key
    try:
        assert reopened.get("a") == {"id": "a", "v": 2}
        assert duplicate_keys(lines(tmp_path)) == []
    finally:
        reopened.close()


def test_torn_last_line_is_cut_off_at_reopen(tmp_path: Path) -> None:
    sink = open_sink(tmp_path)
    sink.write([rec(f"k{i}", v=i) for i in range(5)], token=1, batch_id="b1")
    sink.close()
    (path,) = segment_files(tmp_path)
    intact = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(b'{"id": 9, "na')
    again = open_sink(tmp_path)
    try:
        assert path.read_bytes() == intact
        assert again.count() == 5
        assert again.get("k4") == {"id": "k4", "v": 4}
        assert again.write([rec("k9", v=9)], token=2, batch_id="b2") == result(written=1)
        assert again.get("k9") == {"id": "k9", "v": 9}
    finally:
        again.close()
    rows = lines(tmp_path)
    assert len(rows) == 6
    assert duplicate_keys(rows) == []


def test_a_corrupt_line_in_the_middle_is_a_backend_error(tmp_path: Path) -> None:
    sink = open_sink(tmp_path)
    sink.write([rec("a", v=1)], token=1, batch_id="b1")
    sink.close()
    (path,) = segment_files(tmp_path)
    good = path.read_bytes()
    path.write_bytes(good + b"not json at all\n" + good)
    with pytest.raises(BackendError, match=re.escape(path.name)):
        open_sink(tmp_path)


def test_segments_rotate_and_compaction_spans_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "SEGMENT_BYTES", 2_000)
    sink = open_sink(tmp_path)
    for token in range(1, 11):
        sink.write(
            [rec(f"t{token}-{i}", pad="x" * 100) for i in range(5)],
            token=token,
            batch_id=f"b{token}",
        )
    assert len(segment_files(tmp_path)) >= 3
    # overwrite keys that live in the first segment, and remove a batch from the middle
    sink.write([rec("t1-0", v="new"), rec("t1-1", v="new")], token=20, batch_id="b20")
    assert sink.remove_batch("b5") == 5
    assert sink.get("t1-0") == {"id": "t1-0", "v": "new"}
    assert sink.get("t2-3") == {"id": "t2-3", "pad": "x" * 100}
    sink.close()
    assert all(NAME.match(p.name) for p in tmp_path.iterdir())
    rows = lines(tmp_path)
    assert duplicate_keys(rows) == []
    assert len(rows) == 45
    again = open_sink(tmp_path)
    try:
        assert again.count() == 45
        assert again.get("t1-1") == {"id": "t1-1", "v": "new"}
        assert again.get("t5-0") is None
        assert again.get("t10-4") == {"id": "t10-4", "pad": "x" * 100}
        assert again.write([rec("t3-3", v=1)], token=21, batch_id="b21") == result(written=1)
        assert again.get("t3-3") == {"id": "t3-3", "v": 1}
    finally:
        again.close()
    assert duplicate_keys(lines(tmp_path)) == []


def test_two_sources_in_one_folder_do_not_see_each_other(tmp_path: Path) -> None:
    a = open_sink(tmp_path, "items")
    b = open_sink(tmp_path, "items-extra")  # a name that starts like the other one
    a.write([rec("k", who="a"), rec("only-a", v=1)], token=1, batch_id="shared")
    b.write([rec("k", who="b")], token=1, batch_id="shared")
    assert (a.count(), b.count()) == (2, 1)
    assert a.get("k") == {"id": "k", "who": "a"}
    assert b.get("k") == {"id": "k", "who": "b"}
    assert b.get("only-a") is None
    assert b.remove_batch("shared") == 1
    assert a.count() == 2
    a.close()
    b.close()
    a, b = open_sink(tmp_path, "items"), open_sink(tmp_path, "items-extra")
    try:
        assert (a.count(), b.count()) == (2, 0)
        assert a.get("k") == {"id": "k", "who": "a"}
    finally:
        a.close()
        b.close()
    assert {r["_collector"]["key"] for r in lines(tmp_path, "items")} == {"k", "only-a"}
    assert lines(tmp_path, "items-extra") == []


# --- a writer killed mid-way ---------------------------------------------------------------------
_WRITER = textwrap.dedent(
    """
    import sys
    from collector.sinks.base import SinkRecord
    from collector.sinks.jsonl import JsonlSink

    folder, base = sys.argv[1], int(sys.argv[2])
    sink = JsonlSink(folder, source="items")
    n = 0
    while True:
        n += 1
        start = n % 13
        records = [
            SinkRecord(f"k{j}", {"id": j, "v": base + n, "pad": "x" * 300}, f"u{j}")
            for j in range(start, start + 40)
        ]
        sink.write(records, token=base + n, batch_id=f"b{base + n}")
        print(base + n, start, flush=True)
    """
)


ROUNDS = (25, 3, 60)  # batches acked before each kill


def test_writer_killed_mid_way_leaves_a_sink_that_reopens_clean(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER, encoding="utf-8")
    folder = tmp_path / "out"
    acked: dict[str, int] = {}  # key -> highest token whose write returned (is durable)
    for round_no, batches in enumerate(ROUNDS):
        base = (round_no + 1) * 1_000_000
        proc = subprocess.Popen(
            [sys.executable, str(script), str(folder), str(base)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for _ in range(batches):
                line = proc.stdout.readline()
                assert line, "writer exited early"
                token, start = map(int, line.split())
                for j in range(start, start + 40):
                    acked[f"k{j}"] = token
            proc.send_signal(signal.SIGKILL)  # most likely inside the next write
        finally:
            proc.kill()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        # what the files say before the sink repairs them
        expected: dict[str, tuple[int, dict[str, Any]]] = {}
        for path in segment_files(folder):
            for raw in path.read_bytes().splitlines(keepends=True):
                if not raw.endswith(b"\n"):
                    continue  # torn by the kill; never acked
                row = json.loads(raw)
                meta = row.pop("_collector")
                if meta["key"] not in expected or meta["token"] >= expected[meta["key"]][0]:
                    expected[meta["key"]] = (meta["token"], row)
        sink = open_sink(folder)
        try:
            assert lines(folder)  # every line parses now, no torn tail
            assert duplicate_keys(lines(folder)) == []  # compacted on open
            assert sink.count() == len(expected)
            for key, (_token, row) in expected.items():
                assert sink.get(key) == row
            for key, token in acked.items():
                got = sink.get(key)
                assert got is not None
                assert got["v"] >= token, (key, got["v"], token)
        finally:
            sink.close()
        assert duplicate_keys(lines(folder)) == []


def test_threads_of_one_process_opening_the_sink_at_once_share_its_writer_lock(
    tmp_path: Path,
) -> None:
    """The one-writer lock guards against other processes; threads of this one share it. Eight
    threads opening the sink together all get it (the look-up and the flock were apart: the
    losers of that race were refused as if another process wrote)."""
    import threading

    for round_ in range(20):
        barrier = threading.Barrier(8)
        opened: list[JsonlSink] = []
        refused: list[BaseException] = []

        def open_one(
            name: str, barrier: threading.Barrier, opened: list[JsonlSink],
            refused: list[BaseException],
        ) -> None:  # fmt: skip
            barrier.wait()
            try:
                opened.append(JsonlSink(tmp_path, source=name))
            except BaseException as exc:
                refused.append(exc)

        threads = [
            threading.Thread(target=open_one, args=(f"race-{round_}", barrier, opened, refused))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for sink in opened:
            sink.close()
        assert not refused, refused[0]
