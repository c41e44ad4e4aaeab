"""Great Expectations in a worker process, so validation runs beside fetching, not after it.

GX costs ~7 s to import and tens of milliseconds per batch, all of it CPU under the GIL. In the
crawler's process that time is taken straight from the event loop that drives the requests. A
worker process (``python -m collector.settle.validation_worker SUITE``) imports GX while the run is
still planning, and validates batch N while the loop fetches batch N+1; a batch of 500 records
crosses the pipe in about a millisecond.

The `collector` command starts the worker (:func:`prewarm`) before it imports Prefect. A plain
child process, not ``multiprocessing``: spawn would re-import the caller's main module,
which is wrong for scripts without a ``__main__`` guard. Frames on the pipes are a 4-byte
length and a pickle (the child is our own code, started by us). If the worker dies or cannot
start, batches are validated in-process instead (slower, never wrong).

**The worker lives as long as its pipe.** It runs in a session of its own, so a terminal's
Ctrl-C (SIGINT to the whole foreground process group) or a ``kill`` of the run's group does not
reach it: stopping is the parent's business (:mod:`collector.run.stop`), which still needs the
worker to validate what was fetched before it stops, and then closes the pipe. A parent that
exits at once (a second Ctrl-C, SIGKILL) closes the pipe too; the worker then ends quietly,
at its next read or write, instead of printing a traceback under the run's one line.

**A worker outlives its run, within the process.** GX's import is ~3 s of CPU per worker, and
a process that runs several collects (the fleet, a served deployment, a test session) paid it
per run. :meth:`ValidationWorker.start` takes an idle worker from the process's pool
(:mod:`collector.settle.worker_pool`) built from the same suite *content* (the file's bytes; the
worker's ready frame names the content it read, so a file edited while a worker started is never
mistaken for the old one), or starts one; :func:`prewarm`'s worker waits in that pool for the
first run. At the run's end :meth:`~ValidationWorker.aclose` gives the worker back only when it
is known to be between requests: no thread holds its pipe, it is alive, and no call on it failed,
answered an error, or was cut off. Otherwise it is closed, never reused:

* a run **cancelled** (a Prefect cancel, a stop's timeout) while a request is on the pipe: the
  round-trip thread still holds the pipe, so the worker is closed (its pipe closed; it answers
  into nothing and ends);
* **Ctrl-C**: the worker, in its own session, does not get the signal; the parent's stop closes
  the run as above (a cut request closes it), and at exit ``atexit`` closes the idle ones;
* **SIGKILL** of the parent: no ``atexit``, but every pipe closes with the process, and each
  worker, idle or busy, ends at its next read or write;
* a worker **killed** or crashed: its run validates in-process from then on and closes it; one
  killed while idle is found dead when taken, and the run starts another.

Results never depend on reuse: a worker keeps no state between calls but the built suite (the
property in tests/test_validation_worker_pool.py compares a reused worker, a fresh one and the
in-process validator). Only the first lines of a suite's start-up errors name the file, and a
reused worker has passed its start-up.

**Batches are validated together.** GX's cost is per call (~5 ms per expectation whatever the
row count, see collector.settle.validation), so :meth:`ValidationWorker.validate` does not send each
batch at once: requests wait (up to ``linger_s``, or until ``max_batches`` wait, or until the
caller is inside :meth:`~ValidationWorker.urgent`, as the collect flow is whenever it waits
for a settle) and go to the worker in one round trip, where
:meth:`~collector.settle.validation.SuiteValidator.validate_many` makes one GX call for all of
them when
that is exact (row-level suites) and one per batch otherwise (table-level expectations stay per
batch). The answer carries only the failing rows' indexes and failures, not the records: the
parent rebuilds each :class:`BatchValidation` around its own record objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from collector import defaults
from collector.errors import ConfigError
from collector.settle.validation import (
    BatchValidation,
    FailedExpectation,
    RowFailure,
    SuiteValidator,
)
from collector.settle.worker_pool import Idle, close_process, pool, suite_digest

__all__ = ["ValidationWorker", "prewarm"]

_HEADER = struct.Struct("!I")
_READY = "ready"  # the worker's first frame: GX is imported and the suite built


def prewarm(suite_path: str | Path) -> None:
    """Start a worker for ``suite_path`` now, for the next :class:`ValidationWorker` to adopt.

    The `collector` command calls this before it imports Prefect, so that GX's import runs on
    the other core while Prefect and its server start, instead of during the first fetches. The
    worker waits in the pool (:mod:`collector.settle.worker_pool`) under the file's content; a
    worker already idle there for that content is enough.
    """
    digest = suite_digest(suite_path)
    if digest is None or pool.has(digest):
        return
    with contextlib.suppress(OSError):
        pool.give(Idle(_spawn(str(Path(suite_path).resolve())), digest, greeted=False))


def _spawn(suite_path: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "collector.settle.validation_worker", suite_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "GX_ANALYTICS_ENABLED": "false"},
        start_new_session=True,  # signals to the run's process group are the parent's to handle
    )


_Failures = tuple[FailedExpectation, ...]
_Answer = tuple[list[tuple[int, _Failures]], _Failures, float]


def _compact(outcome: BatchValidation) -> _Answer:
    """What the parent needs to rebuild ``outcome`` around its own records (no records)."""
    bad = [(row.index, row.failed) for row in outcome.bad]
    return bad, outcome.table_failures, outcome.seconds


def _rebuild(records: list[dict[str, Any]], answer: _Answer) -> BatchValidation:
    bad_rows, table_failures, seconds = answer
    failing = {index for index, _ in bad_rows}
    return BatchValidation(
        good=[record for index, record in enumerate(records) if index not in failing],
        bad=[RowFailure(index, records[index], failed) for index, failed in bad_rows],
        table_failures=table_failures,
        seconds=seconds,
    )


class _Request:
    __slots__ = ("future", "records")

    def __init__(self, records: list[dict[str, Any]], future: asyncio.Future[BatchValidation]):
        self.records = records
        self.future = future


class ValidationWorker:
    """Validate batches against one suite in a separate process, several batches per call.

    The pipe round trip runs in a thread, which waits on the pipe with the GIL released, so
    the event loop goes on fetching meanwhile. ``linger_s=0`` sends every request at once
    (batches still travel together when they queue behind a running call).

    The process comes from the pool when one is idle for the suite's content, and goes back to
    it at :meth:`aclose` when it is known to be between requests (see the module docstring).
    """

    def __init__(
        self,
        suite_path: str | Path,
        *,
        linger_s: float = defaults.VALIDATION_LINGER_S,
        max_batches: int = defaults.VALIDATION_MAX_BATCHES,
    ) -> None:
        self.suite_path = str(Path(suite_path).resolve())
        self.linger_s = linger_s
        self.max_batches = max(1, max_batches)
        self.calls = 0  # round trips (or in-process calls) made, for benchmarks and tests
        self.reused = False  # the process came from the pool (for tests and benchmarks)
        self._process: subprocess.Popen[bytes] | None = None
        self._greeted: subprocess.Popen[bytes] | None = None  # its ready frame was read
        self._wanted: str | None = None  # the suite file's content when the process was taken
        self._digest: str | None = None  # the content the greeted process says it built
        self._state = threading.Lock()  # guards _process (the run's thread and pipe threads)
        self._pipe = threading.Lock()  # held for every read and write on the pipes
        self._spoiled = False  # a call failed or was cut: the process must not be reused
        self._failed = False
        self._local: SuiteValidator | None = None
        self._pending: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._urgent = 0
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Take an idle worker for this suite's content from the pool, or start one; GX
        imports there from now on."""
        with self._state:
            if self._process is not None or self._failed:
                return
            self._spoiled, self._digest = False, None
            self._wanted = suite_digest(self.suite_path)
            idle = pool.take(self._wanted) if self._wanted is not None else None
            self.reused = idle is not None
            if idle is not None:
                self._process = idle.process
                if idle.greeted:
                    self._greeted, self._digest = idle.process, idle.digest
                return
            try:
                self._process = _spawn(self.suite_path)
            except OSError:
                self._failed = True

    async def ready(self) -> None:
        """Wait until the worker has imported GX and built the suite (start it if needed).

        The run loop waits for this before its first claim: GX's import (~7 s of CPU) is
        start-up, and batches fetched meanwhile could only wait for it, holding their leases,
        while the import took CPU from the fetching on a small box. A worker that cannot start
        is given up on here, as on a failed call (batches are then validated in-process).
        """
        if self._failed:
            return
        self.start()
        try:
            await asyncio.to_thread(self._greet_now)
        except (OSError, EOFError, ValueError, pickle.PickleError):
            self._failed = True
            await asyncio.to_thread(self._stop)

    def _current(self) -> subprocess.Popen[bytes]:
        with self._state:
            process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise OSError("validation worker is not running")
        return process

    def _greet_now(self) -> None:
        with self._pipe, self._spoiled_on_error():
            self._greet(self._current())

    @contextlib.contextmanager
    def _spoiled_on_error(self) -> Iterator[None]:
        """A pipe call that did not end cleanly leaves the pipe in an unknown state."""
        try:
            yield
        except BaseException:
            self._spoiled = True
            raise

    def _greet(self, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        """Read the worker's ready frame, once per process (before its first answer); the
        process to use (a new one when a prewarmed one was built from other content)."""
        while process is not self._greeted:
            assert process.stdout is not None
            hello = pickle.loads(_read_frame(process.stdout))
            if isinstance(hello, ConfigError):
                raise hello  # the suite is wrong: no point validating in-process either
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == _READY):
                raise ValueError("validation worker did not say it was ready")
            if self.reused and hello[1] != self._wanted:
                # prewarmed, then the file changed before the worker read it: not this suite
                fresh = _spawn(self.suite_path)
                with self._state:
                    if self._process is not process:
                        fresh.kill()
                        raise OSError("validation worker was closed")
                    self._process, self.reused = fresh, False
                _close_in_background(process)
                process = fresh
                continue
            self._greeted, self._digest = process, hello[1]
        return process

    async def validate(self, records: list[dict[str, Any]]) -> BatchValidation:
        """Validate one batch (it may travel with others waiting at the same time)."""
        future: asyncio.Future[BatchValidation] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(records, future))
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run_pump(), name="validation-pump")
        return await future

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """While inside, nothing lingers: the caller is waiting for an answer (a settle)."""
        self._urgent += 1
        if self._wake is not None:
            self._wake.set()
        try:
            yield
        finally:
            self._urgent -= 1

    async def _run_pump(self) -> None:
        assert self._wake is not None
        while self._pending:
            deadline = asyncio.get_running_loop().time() + self.linger_s
            while not self._urgent and len(self._pending) < self.max_batches:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            jobs = self._pending[: self.max_batches]
            del self._pending[: len(jobs)]
            try:
                answers = await self._validate_many([job.records for job in jobs])
            except asyncio.CancelledError:
                for job in [*jobs, *self._pending]:
                    job.future.cancel()
                raise
            except Exception as exc:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            for job, answer in zip(jobs, answers, strict=True):
                if job.future.done():
                    continue
                if isinstance(answer, BaseException):
                    job.future.set_exception(answer)
                else:
                    job.future.set_result(answer)

    async def _validate_many(
        self, batches: list[list[dict[str, Any]]]
    ) -> list[BatchValidation | BaseException]:
        self.calls += 1
        if not self._failed:
            self.start()
            try:
                return await asyncio.to_thread(self._round_trip, batches)
            except (OSError, EOFError, ValueError, pickle.PickleError):
                self._failed = True
                await asyncio.to_thread(self._stop)  # waits up to 5 s for the process: off the loop
        if self._local is None:
            self._local = SuiteValidator(self.suite_path)
        return list(await asyncio.to_thread(self._local.validate_many, batches))

    def _round_trip(
        self, batches: list[list[dict[str, Any]]]
    ) -> list[BatchValidation | BaseException]:
        with self._pipe, self._spoiled_on_error():
            process = self._greet(self._current())
            assert process.stdin is not None and process.stdout is not None
            frame = pickle.dumps(batches, protocol=pickle.HIGHEST_PROTOCOL)
            process.stdin.write(_HEADER.pack(len(frame)) + frame)
            process.stdin.flush()
            answer = pickle.loads(_read_frame(process.stdout))
            if isinstance(answer, BaseException):
                self._spoiled = True  # errored: answered, but not handed to another run
                return [answer] * len(batches)  # the whole call failed (e.g. a suite GX rejects)
            if not isinstance(answer, list) or len(answer) != len(batches):
                raise ValueError(f"validation worker answered {type(answer).__name__}")
        return [_rebuild(records, item) for records, item in zip(batches, answer, strict=True)]

    def _stop(self) -> None:
        """Close the process, whatever its state (a failed call, a worker that died)."""
        self._spoiled = True
        self._release()

    def _release(self, *, background: bool = False) -> None:
        """Hand the process back to the pool when it is known to be between requests and
        healthy; close it otherwise. Idempotent: the process is the run's no longer."""
        between = self._pipe.acquire(blocking=False)  # no thread is reading or writing it
        try:
            with self._state:
                process, self._process = self._process, None
                greeted, self._greeted = self._greeted, None
        finally:
            if between:
                self._pipe.release()
        if process is None:
            return
        keep = between and not self._spoiled and not self._failed and process.poll() is None
        if keep and greeted is process and self._digest is not None:
            pool.give(Idle(process, self._digest, greeted=True))
        elif keep and greeted is None and self._wanted is not None:
            pool.give(Idle(process, self._wanted, greeted=False))  # still starting: no request
        elif background:
            _close_in_background(process)
        else:
            close_process(process)

    async def aclose(self) -> None:
        """Wait for the requests in flight, then give the worker back (or close it).

        Cancelled while waiting, the pump is cancelled too and the worker closed without
        waiting for it (it may be in a request; it ends when its pipe closes).
        """
        pump = self._pump
        try:
            if pump is not None and not pump.done():
                with self.urgent(), contextlib.suppress(Exception):
                    await pump
        except BaseException:
            if pump is not None:
                pump.cancel()
            self._spoiled = True
            self._release(background=True)
            raise
        await asyncio.to_thread(self._release)

    def close(self) -> None:
        """:meth:`aclose` for a run closed synchronously (no requests can be in flight)."""
        self._release()


def _close_in_background(process: subprocess.Popen[bytes]) -> None:
    """Close the pipe now and reap the process on a thread (nothing waits for it)."""
    threading.Thread(target=close_process, args=(process,), daemon=True).start()


def _read_frame(stream: IO[bytes]) -> bytes:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("validation worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError("validation worker closed its pipe mid-answer")
    return body


def _serve(suite_path: str, inbox: BinaryIO, outbox: BinaryIO) -> int:
    before = suite_digest(suite_path)
    try:
        validator = SuiteValidator(suite_path)
        validator.validate([{}])  # import GX and build the context before the first batch
    except ConfigError as exc:  # a suite GX rejects: the first frame says so, and we are done
        said = pickle.dumps(ConfigError(str(exc)), protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_HEADER.pack(len(said)) + said)
        outbox.flush()
        return 0
    # the content built, for the pool's key: None (never shared) if the file changed meanwhile
    built = before if suite_digest(suite_path) == before else None
    ready = pickle.dumps((_READY, built), protocol=pickle.HIGHEST_PROTOCOL)
    outbox.write(_HEADER.pack(len(ready)) + ready)
    outbox.flush()
    while True:
        try:
            records = pickle.loads(_read_frame(inbox))  # a list of batches
        except EOFError:
            return 0  # the parent closed the pipe: done
        answer: Any
        try:
            answer = [_compact(outcome) for outcome in validator.validate_many(records)]
        except Exception as exc:  # sent back and raised in the parent
            answer = exc
        frame = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_HEADER.pack(len(frame)) + frame)
        outbox.flush()


if __name__ == "__main__":
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by GX must not corrupt the frames
    try:
        code = _serve(sys.argv[1], sys.stdin.buffer, out)
    except BrokenPipeError:
        code = 0  # the parent is gone (it exited at once) while we validated: nobody to tell
    # Every answer is written and flushed, and the worker keeps nothing: skip the interpreter's
    # teardown, which with GX loaded takes ~1.5-2.5 s that the run would wait for when it closes.
    sys.stderr.flush()
    os._exit(code)
