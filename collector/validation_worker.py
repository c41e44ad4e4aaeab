"""Great Expectations in a worker process, so validation runs beside fetching, not after it.

GX costs ~7 s to import and tens of milliseconds per batch, all of it CPU under the GIL. In the
crawler's process that time is taken straight from the event loop that drives the requests. A
worker process (``python -m collector.validation_worker SUITE``) imports GX while the run is
still planning, and validates batch N while the loop fetches batch N+1; a batch of 500 records
crosses the pipe in about a millisecond.

The `collector` command starts the worker (:func:`prewarm`) before it imports Prefect. A plain
child process, not ``multiprocessing``: spawn would re-import the caller's main module,
which is wrong for scripts without a ``__main__`` guard. Frames on the pipes are a 4-byte
length and a pickle (the child is our own code, started by us). If the worker dies or cannot
start, batches are validated in-process instead (slower, never wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, BinaryIO

from collector.validation import BatchValidation, SuiteValidator

__all__ = ["ValidationWorker", "prewarm"]

_HEADER = struct.Struct("!I")


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
        [sys.executable, "-m", "collector.validation_worker", suite_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "GX_ANALYTICS_ENABLED": "false"},
    )


class ValidationWorker:
    """Validate batches against one suite in a separate process (one batch at a time).

    The pipe round trip runs in a thread, which waits on the pipe with the GIL released, so
    the event loop goes on fetching meanwhile.
    """

    def __init__(self, suite_path: str | Path) -> None:
        self.suite_path = str(Path(suite_path).resolve())
        self._process: subprocess.Popen[bytes] | None = None
        self._failed = False
        self._local: SuiteValidator | None = None
        self._lock: asyncio.Lock | None = None

    def start(self) -> None:
        """Start (or adopt a prewarmed) worker process; GX imports there from now on."""
        if self._process is None and not self._failed:
            self._process = _prewarmed.pop(self.suite_path, None)
            if self._process is None or self._process.poll() is not None:
                try:
                    self._process = _spawn(self.suite_path)
                except OSError:
                    self._failed = True

    async def validate(self, records: list[dict[str, Any]]) -> BatchValidation:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._failed:
                self.start()
                try:
                    return await asyncio.to_thread(self._round_trip, records)
                except (OSError, EOFError, ValueError, pickle.PickleError):
                    self._failed = True
                    self._stop()
        if self._local is None:
            self._local = SuiteValidator(self.suite_path)
        return await asyncio.to_thread(self._local.validate, records)

    def _round_trip(self, records: list[dict[str, Any]]) -> BatchValidation:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise OSError("validation worker is not running")
        frame = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        process.stdin.write(_HEADER.pack(len(frame)) + frame)
        process.stdin.flush()
        answer = pickle.loads(_read_frame(process.stdout))
        if isinstance(answer, BaseException):
            raise answer
        if not isinstance(answer, BatchValidation):
            raise ValueError(f"validation worker answered {type(answer).__name__}")
        return answer

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

    async def aclose(self) -> None:
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
    validator.validate([{}])  # import GX and build the context before the first batch
    while True:
        try:
            records = pickle.loads(_read_frame(inbox))
        except EOFError:
            return 0  # the parent closed the pipe: done
        answer: Any
        try:
            answer = validator.validate(records)
        except Exception as exc:  # sent back and raised in the parent
            answer = exc
        frame = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_HEADER.pack(len(frame)) + frame)
        outbox.flush()


if __name__ == "__main__":
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by GX must not corrupt the frames
    raise SystemExit(_serve(sys.argv[1], sys.stdin.buffer, out))
