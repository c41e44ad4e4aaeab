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

__all__ = ["ValidationWorker", "prewarm"]

_HEADER = struct.Struct("!I")
_READY = "ready"  # the worker's first frame: GX is imported and the suite built


# Process-wide: a worker started before the run (while Prefect starts) is handed to the run
# that asks for its suite; at most one per suite path, taken (popped) by that run.
_prewarmed: dict[str, subprocess.Popen[bytes]] = {}


def prewarm(suite_path: str | Path) -> None:
    """Start a worker for ``suite_path`` now, for the next :class:`ValidationWorker` to adopt.

    The `collector` command calls this before it imports Prefect, so that GX's import runs on
    the other core while Prefect and its server start, instead of during the first fetches.
    """
    key = str(Path(suite_path).resolve())
    if key not in _prewarmed:
        with contextlib.suppress(OSError):
            _prewarmed[key] = _spawn(key)


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
        self._process: subprocess.Popen[bytes] | None = None
        self._greeted: subprocess.Popen[bytes] | None = None  # its ready frame was read
        self._greeting = threading.Lock()
        self._failed = False
        self._local: SuiteValidator | None = None
        self._pending: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._urgent = 0
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start (or adopt a prewarmed) worker process; GX imports there from now on."""
        if self._process is None and not self._failed:
            self._process = _prewarmed.pop(self.suite_path, None)
            if self._process is None or self._process.poll() is not None:
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
            await asyncio.to_thread(self._greet)
        except (OSError, EOFError, ValueError, pickle.PickleError):
            self._failed = True
            await asyncio.to_thread(self._stop)

    def _greet(self) -> None:
        """Read the worker's ready frame, once per process (before its first answer)."""
        with self._greeting:
            process = self._process
            if process is None or process is self._greeted:
                return
            if process.stdout is None:
                raise OSError("validation worker is not running")
            hello = pickle.loads(_read_frame(process.stdout))
            if isinstance(hello, ConfigError):
                raise hello  # the suite is wrong: no point validating in-process either
            if hello != _READY:
                raise ValueError("validation worker did not say it was ready")
            self._greeted = process

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
        self._greet()
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise OSError("validation worker is not running")
        frame = pickle.dumps(batches, protocol=pickle.HIGHEST_PROTOCOL)
        process.stdin.write(_HEADER.pack(len(frame)) + frame)
        process.stdin.flush()
        answer = pickle.loads(_read_frame(process.stdout))
        if isinstance(answer, BaseException):
            return [answer] * len(batches)  # the whole call failed (e.g. a suite GX rejects)
        if not isinstance(answer, list) or len(answer) != len(batches):
            raise ValueError(f"validation worker answered {type(answer).__name__}")
        return [_rebuild(records, item) for records, item in zip(batches, answer, strict=True)]

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    async def aclose(self) -> None:
        if self._pump is not None:
            with self.urgent(), contextlib.suppress(Exception):
                await self._pump
        await asyncio.to_thread(self._stop)


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
    validator = SuiteValidator(suite_path)
    try:
        validator.validate([{}])  # import GX and build the context before the first batch
    except ConfigError as exc:  # a suite GX rejects: the first frame says so, and we are done
        said = pickle.dumps(ConfigError(str(exc)), protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_HEADER.pack(len(said)) + said)
        outbox.flush()
        return 0
    ready = pickle.dumps(_READY, protocol=pickle.HIGHEST_PROTOCOL)
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
