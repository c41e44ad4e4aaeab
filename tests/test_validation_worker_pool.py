"""Validation workers kept for the next run of the same suite content (settle.worker_pool).

Real worker processes throughout: reuse happens for the same bytes (under another path too), never
for changed bytes, never for two runs at once, never after a worker died or was cut off
mid-request; and a reused worker answers exactly like a fresh one and like the in-process
validator (the plain reference).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.settle.rowsplit import BatchValidation
from collector.settle.validation import SuiteValidator
from collector.settle.validation_worker import ValidationWorker, prewarm
from collector.settle.worker_pool import Idle, WorkerPool, close_process, pool, suite_digest

EXPECTATIONS: list[dict[str, Any]] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "price", "min_value": 0, "max_value": 100},
    },
    {
        "type": "expect_column_values_to_be_in_set",
        "kwargs": {"column": "kind", "value_set": ["a", "b"]},
    },
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 2}},
]
OTHER: list[dict[str, Any]] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "price"}},
]
RECORDS: list[dict[str, Any]] = [
    {"id": 1, "name": "a", "price": 5, "kind": "a"},
    {"id": 2, "name": None, "price": 5, "kind": "b"},
    {"id": 3, "name": "c", "price": None, "kind": "a"},
]


slow = pytest.mark.slow  # real GX workers: ~4 s of CPU to start each (not the fast lane)


@pytest.fixture(autouse=True, scope="module")
def _own_pool() -> Iterator[None]:
    """No idle worker from other files; the tests here share theirs (the same suite content
    under each test's own path), as the runs of one process do, so each start is paid once."""
    pool.close_all()
    yield
    pool.close_all()


def _write(path: Path, expectations: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"name": "items", "expectations": expectations}), encoding="utf-8")
    return path


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    return _write(tmp_path / "suite.json", EXPECTATIONS)


def _shape(result: BatchValidation) -> tuple[Any, ...]:
    """Everything a run reads of a result (not the time it took)."""
    bad = [
        (row.index, tuple((f.expectation, f.column, f.message) for f in row.failed))
        for row in result.bad
    ]
    table = tuple((f.expectation, f.column, f.message) for f in result.table_failures)
    return [id(record) for record in result.good], bad, table


async def _idle_one(path: Path) -> None:
    """At least one idle worker for ``path``'s content (a run used it and gave it back)."""
    if not _idle_for(path):
        await _used_once(path)


def _forget(path: Path) -> None:
    """Close the idle workers for ``path``'s content."""
    while (taken := pool.take(suite_digest(path) or "")) is not None:
        close_process(taken.process)


def _idle_for(path: Path) -> list[Idle]:
    return [idle for idle in pool.idle() if idle.digest == suite_digest(path)]


async def _used_once(path: Path) -> int:
    """A run's worker: started (or taken), used, given back; its pid."""
    worker = ValidationWorker(path, linger_s=0)
    try:
        await worker.ready()
        await worker.validate(RECORDS)
        assert worker._process is not None
        return worker._process.pid
    finally:
        await worker.aclose()


def _bad(result: BatchValidation) -> list[tuple[int, tuple[str, ...]]]:
    return [(row.index, tuple(f.expectation for f in row.failed)) for row in result.bad]


@slow
async def test_prewarm_is_the_first_run_s_worker(suite: Path) -> None:
    _forget(suite)  # none for this content yet, whatever ran before
    prewarm(suite)
    prewarm(suite)  # one is enough
    (prewarmed,) = _idle_for(suite)
    assert not prewarmed.greeted
    assert await _used_once(suite) == prewarmed.process.pid
    (back,) = _idle_for(suite)
    assert back.process is prewarmed.process and back.greeted


@slow
async def test_the_same_content_gets_the_same_worker_under_any_path(
    suite: Path, tmp_path: Path
) -> None:
    await _idle_one(suite)
    latest = _idle_for(suite)[-1].process.pid  # the one a run takes: given back last
    twin = tmp_path / "elsewhere" / "copy.json"
    twin.parent.mkdir()
    twin.write_bytes(suite.read_bytes())
    worker = ValidationWorker(twin, linger_s=0)
    try:
        await worker.ready()
        assert worker.reused and worker._process is not None and worker._process.pid == latest
        assert latest not in [idle.process.pid for idle in pool.idle()]  # no one else has it
        assert _bad(await worker.validate(RECORDS)) == [
            (1, ("expect_column_values_to_not_be_null",))
        ]
    finally:
        await worker.aclose()
    assert _idle_for(suite)[-1].process.pid == latest  # back, for the next run


@slow
async def test_changed_content_never_gets_the_old_worker(suite: Path) -> None:
    await _idle_one(suite)
    old = {idle.process.pid for idle in _idle_for(suite)}
    _write(suite, OTHER)  # same path, other bytes
    assert _idle_for(suite) == []
    worker = ValidationWorker(suite, linger_s=0)
    try:
        await worker.ready()
        assert not worker.reused and worker._process is not None
        assert worker._process.pid not in old
        result = await worker.validate(RECORDS)
    finally:
        await worker.aclose()
    assert _bad(result) == [(2, ("expect_column_values_to_not_be_null",))]  # OTHER's verdict
    (kept,) = _idle_for(suite)
    assert kept.process.pid not in old  # kept under the new content, the old ones under theirs
    assert {idle.process.pid for idle in pool.idle()} - {kept.process.pid} <= old


@slow
async def test_two_runs_at_once_never_share_a_worker(suite: Path) -> None:
    await _idle_one(suite)
    one, two = ValidationWorker(suite, linger_s=0), ValidationWorker(suite, linger_s=0)
    try:
        await asyncio.gather(one.ready(), two.ready())
        assert one._process is not None and two._process is not None
        pids = {one._process.pid, two._process.pid}
        assert len(pids) == 2 and one.reused
        results = await asyncio.gather(one.validate(RECORDS), two.validate(RECORDS))
    finally:
        await asyncio.gather(one.aclose(), two.aclose())
    assert _bad(results[0]) == _bad(results[1])
    assert {idle.process.pid for idle in _idle_for(suite)} == pids  # both back, each its own


@slow
async def test_a_worker_killed_while_idle_is_not_handed_out(suite: Path) -> None:
    await _idle_one(suite)
    dead = _idle_for(suite)[-1].process  # the one the next run would take
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    worker = ValidationWorker(suite, linger_s=0)
    try:
        await worker.ready()
        assert worker._process is not None and worker._process is not dead
        assert _bad(await worker.validate(RECORDS))[0][0] == 1
    finally:
        await worker.aclose()
    assert dead not in [idle.process for idle in pool.idle()]


@slow
async def test_a_worker_killed_during_a_run_is_closed_not_kept(suite: Path) -> None:
    worker = ValidationWorker(suite, linger_s=0)
    try:
        await worker.ready()
        assert worker._process is not None
        killed = worker._process
        os.kill(killed.pid, signal.SIGKILL)
        result = await worker.validate(RECORDS)  # validated in-process from here on
    finally:
        await worker.aclose()
    assert worker._failed and _bad(result)[0][0] == 1
    assert killed not in [idle.process for idle in pool.idle()]


async def _stopped_mid_call(
    suite: Path,
) -> tuple[ValidationWorker, subprocess.Popen[bytes], asyncio.Future[BatchValidation]]:
    """A run's worker, stopped (SIGSTOP) with a request on its pipe: no answer can come."""
    worker = ValidationWorker(suite, linger_s=0)
    await worker.ready()
    process = worker._process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    asking = asyncio.ensure_future(worker.validate(RECORDS))
    while not worker._pipe.locked():  # the round trip is on the pipe
        await asyncio.sleep(0.01)
    return worker, process, asking


@slow
async def test_a_run_cancelled_while_a_call_is_on_the_pipe_closes_its_worker(
    suite: Path,
) -> None:
    """Cancelled while it waits for the answer at its close: the worker's state is unknown."""
    worker, process, asking = await _stopped_mid_call(suite)
    try:
        closing = asyncio.ensure_future(worker.aclose())
        await asyncio.sleep(0.05)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert worker._process is None
    finally:
        os.kill(process.pid, signal.SIGCONT)  # it answers into nothing, reads EOF, ends
    assert await asyncio.to_thread(process.wait, 30) is not None
    assert process not in [idle.process for idle in pool.idle()]


@slow
async def test_a_pump_cancelled_with_a_call_on_the_pipe_closes_its_worker(suite: Path) -> None:
    """The pump is cancelled (as asyncio.run cancels what is left), then the run closes."""
    worker, process, asking = await _stopped_mid_call(suite)
    resumed = threading.Thread(target=_resume_once_released, args=(worker, process.pid))
    resumed.start()
    try:
        assert worker._pump is not None
        worker._pump.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        await worker.aclose()  # the round-trip thread still holds the pipe: closed
    finally:
        resumed.join()
    assert process.poll() is not None
    assert process not in [idle.process for idle in pool.idle()]


def _resume_once_released(worker: ValidationWorker, pid: int) -> None:
    """Let the stopped worker go on once the run has let go of it (its decision is made)."""
    deadline = time.monotonic() + 60
    while worker._process is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGCONT)


_IMPOSTOR = """
import pickle, struct, sys
hello = pickle.dumps(("ready", "not the suite's digest"))
sys.stdout.buffer.write(struct.pack("!I", len(hello)) + hello)
sys.stdout.buffer.flush()
sys.stdin.buffer.read()
"""


@slow
async def test_a_prewarmed_worker_built_from_other_bytes_is_replaced(suite: Path) -> None:
    """The file changed between prewarm's look and the worker's read: its greeting says so,
    and the run starts a worker of its own (a stand-in greets here: only the greeting counts)."""
    stale = subprocess.Popen(
        [sys.executable, "-c", _IMPOSTOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    _forget(suite)  # the stand-in is the only one for this content
    pool.give(Idle(stale, suite_digest(suite) or "", greeted=False))
    worker = ValidationWorker(suite, linger_s=0)
    try:
        await worker.ready()
        assert worker._process is not None and worker._process is not stale
        result = await worker.validate(RECORDS)
    finally:
        await worker.aclose()
    assert _bad(result)[0] == (1, ("expect_column_values_to_not_be_null",))
    assert await asyncio.to_thread(stale.wait, 30) is not None  # closed
    assert stale not in [idle.process for idle in pool.idle()]


async def _drained(source_path: Path, run_id: str) -> Any:
    """A whole run without Prefect (plan, drain, finish), as tests/test_drain.py runs one."""
    from collector.config import load_source
    from collector.run.collection import Collection
    from collector.run.drain import DrainPolicy, drain

    with Collection(load_source(source_path), run_id=run_id) as run:
        run.plan()
        async with run.engine() as engine:
            try:
                await drain(run, lambda lease: run.fetch(engine, lease), DrainPolicy(batch_size=8))
            finally:
                await run.aclose()
        run.finish()
        return run.summary()


@slow
async def test_a_run_with_nothing_to_fetch_does_not_wait_for_gx(tmp_path: Path) -> None:
    """The everyday rerun (every item fresh) claims nothing, so it neither waits for GX's
    import nor greets its worker: the worker goes back to the pool still starting (and is
    killed at exit). The first run, with items to fetch, waited for it as ever."""
    from collector.demo.site import FaultSite
    from tests.helpers import write_source

    suite = _write(tmp_path / "suite.json", OTHER)
    with FaultSite() as site:
        source = write_source(
            tmp_path,
            seeds={"urls": [site.url(f"/items/{i}.json") for i in range(12)]},
            validation={"suite": "suite.json"},
        )
        _forget(suite)
        first = await _drained(source, "run-1")
        assert first.balanced and first.stored + first.dead_lettered == 12, first.problems
        assert [idle.greeted for idle in _idle_for(suite)] == [True]
        _forget(suite)  # the second run starts a worker of its own
        again = await _drained(source, "run-2")
    assert again.balanced and (again.discovered, again.claimed) == (0, 0), again.problems
    assert [idle.greeted for idle in _idle_for(suite)] == [False]
    _forget(suite)


@slow
async def test_a_run_gives_its_worker_to_the_next_run_of_the_same_suite(
    suite: Path, tmp_path: Path
) -> None:
    """The wiring in Run: ``Run.open`` closes its worker into the pool; ``with Run(...)`` too."""
    from collector.config import load_source
    from collector.run.collection import Run
    from tests.helpers import write_source

    pids = []
    for n in range(2):
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        (folder / "suite.json").write_bytes(suite.read_bytes())
        source = load_source(
            write_source(
                folder, seeds={"urls": ["https://example.test/1"]},
                validation={"suite": "suite.json"},
            )
        )  # fmt: skip
        async with Run.open(source, run_id=f"r{n}") as run:
            assert run.validator is not None
            await run.validator.ready()
            assert run.validator._process is not None
            pids.append(run.validator._process.pid)
            assert run.validator._process not in [idle.process for idle in pool.idle()]
    assert pids[0] == pids[1]
    with Run(source, run_id="r3") as run:
        assert run.validator is not None
        run.validator.start()
        assert run.validator.reused and run.validator._process is not None
        pid = run.validator._process.pid
    assert pid in [idle.process.pid for idle in _idle_for(suite)]


def _sleeper() -> subprocess.Popen[bytes]:
    """A stand-in process that, like the worker, ends when its pipe closes (no GX to import)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_idle_workers_are_bounded_and_closed() -> None:
    kept = WorkerPool(keep=2)
    given = [Idle(_sleeper(), f"content {n}", greeted=True) for n in range(4)]
    for idle in given:
        kept.give(idle)
    assert kept.idle() == given[2:]  # the two idle longest were closed
    assert [idle.process.poll() is not None for idle in given[:2]] == [True, True]
    assert kept.take("content 2") == given[2] and kept.take("content 2") is None
    kept.close_all()
    assert given[3].process.poll() is not None and kept.idle() == []
    close_process(given[2].process)


def _importing() -> subprocess.Popen[bytes]:
    """A stand-in for a worker still importing GX: it reads its pipe only after 3 s, then ends
    by itself (exit 0), as a real one does at its first read of a closed pipe."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(3); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_a_worker_still_starting_is_killed_at_exit_not_waited_for() -> None:
    """A prewarmed worker that no run greeted (a run with nothing to validate) has had no
    request: closing it waits for nothing (killed, not left to end its import and exit 0),
    while a greeted one is still closed by its pipe and ends by itself."""
    kept = WorkerPool(keep=4)
    starting = Idle(_importing(), "content", greeted=False)
    greeted = Idle(_importing(), "content", greeted=True)
    kept.give(starting)
    kept.give(greeted)
    kept.close_all(wait_s=30)
    assert starting.process.returncode == -signal.SIGKILL
    assert greeted.process.returncode == 0  # its pipe closed; it ended at its read


# --- a reused worker answers like a fresh one and like the in-process validator ---------------
VALUES = (
    st.none()
    | st.integers(-5, 200)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.sampled_from(["a", "b", "c", "", "ä"])
    | st.booleans()
    | st.lists(st.integers(0, 3), max_size=2)
    | st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 3), max_size=2)
)
RECORD = st.dictionaries(st.sampled_from(["id", "name", "price", "kind", "extra"]), VALUES)
BATCHES = st.lists(st.lists(RECORD, max_size=6), min_size=1, max_size=3)


class _Three:
    """One event loop for every example: a fresh worker kept by the test, and a worker given back
    to the pool and taken again by each example (a new owner every time)."""

    def __init__(self, suite: Path) -> None:
        self.suite = suite
        self.loop = asyncio.new_event_loop()
        self.fresh = ValidationWorker(suite, linger_s=0)
        self.reference = SuiteValidator(suite)
        self.pids: set[int] = set()
        self.loop.run_until_complete(self._prime())

    async def _prime(self) -> None:
        await _idle_one(self.suite)  # a worker that has served another run, now idle
        digest = suite_digest(self.suite) or ""
        aside = []  # out of the pool a moment, so the fresh one is started for this test
        while (idle := pool.take(digest)) is not None:
            aside.append(idle)
        try:
            await self.fresh.ready()  # never handed from run to run
        finally:
            for idle in reversed(aside):
                pool.give(idle)
        assert not self.fresh.reused

    async def _both(self, batches: list[list[dict[str, Any]]]) -> tuple[Any, Any]:
        reused = ValidationWorker(self.suite, linger_s=0)
        try:
            await reused.ready()
            assert reused.reused and reused._process is not None
            self.pids.add(reused._process.pid)
            again = await asyncio.gather(*(reused.validate(batch) for batch in batches))
        finally:
            await reused.aclose()
        first = await asyncio.gather(*(self.fresh.validate(batch) for batch in batches))
        return again, first

    def check(self, batches: list[list[dict[str, Any]]]) -> None:
        again, first = self.loop.run_until_complete(self._both(batches))
        for batch, one, two in zip(batches, again, first, strict=True):
            plain = _shape(self.reference.validate(batch))
            assert _shape(one) == plain
            assert _shape(two) == plain

    def close(self) -> None:
        self.loop.run_until_complete(self.fresh.aclose())
        self.loop.close()


@pytest.fixture
def three(suite: Path) -> Iterator[_Three]:
    compared = _Three(suite)
    yield compared
    compared.close()
    assert len(compared.pids) == 1  # every example had the same reused worker


@slow
@settings(
    max_examples=30,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=BATCHES)
def test_a_reused_worker_answers_like_a_fresh_one_and_in_process(
    three: _Three, batches: list[list[dict[str, Any]]]
) -> None:
    three.check(batches)
