"""Great Expectations in a worker process, so validation runs beside fetching, not after it.

GX costs ~7 s to import and tens of milliseconds per batch, all of it CPU under the GIL. In the
crawler's process that time is taken straight from the event loop that drives the requests. A
worker process (``python -m collector.validation_worker SUITE``) imports GX while the run is
still planning, and validates batch N while the loop fetches batch N+1; a batch of 500 records
crosses the pipe in about a millisecond.

A plain child process, not ``multiprocessing``: spawn would re-import the caller's main module,
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
import sys
from pathlib import Path
from typing import Any, BinaryIO

from collector.validation import BatchValidation, SuiteValidator

__all__ = ["ValidationWorker"]

_HEADER = struct.Struct("!I")


class ValidationWorker:
    """Validate batches against one suite in a separate process (one batch at a time)."""

    def __init__(self, suite_path: str | Path) -> None:
        self.suite_path = str(suite_path)
        self._process: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Task[None] | None = None
        self._failed = False
        self._local: SuiteValidator | None = None
        self._lock: asyncio.Lock | None = None

    def start(self) -> None:
        """Start the worker in the background (call from inside the event loop)."""
        if self._starting is None and not self._failed:
            self._starting = asyncio.get_running_loop().create_task(self._spawn())

    async def _spawn(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "collector.validation_worker", self.suite_path,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "GX_ANALYTICS_ENABLED": "false"},
        )  # fmt: skip

    async def validate(self, records: list[dict[str, Any]]) -> BatchValidation:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._failed:
                try:
                    return await self._remote(records)
                except (OSError, EOFError, asyncio.IncompleteReadError, pickle.PickleError):
                    self._failed = True
                    await self._stop()
        if self._local is None:
            self._local = SuiteValidator(self.suite_path)
        return await asyncio.to_thread(self._local.validate, records)

    async def _remote(self, records: list[dict[str, Any]]) -> BatchValidation:
        self.start()
        assert self._starting is not None
        await self._starting
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        frame = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        process.stdin.write(_HEADER.pack(len(frame)) + frame)
        await process.stdin.drain()
        (size,) = _HEADER.unpack(await process.stdout.readexactly(_HEADER.size))
        answer = pickle.loads(await process.stdout.readexactly(size))
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, BatchValidation)
        return answer

    async def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def aclose(self) -> None:
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting
        await self._stop()


def _serve(suite_path: str, inbox: BinaryIO, outbox: BinaryIO) -> int:
    validator = SuiteValidator(suite_path)
    validator.validate([{}])  # import GX and build the context before the first batch
    while True:
        header = inbox.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return 0  # the parent closed the pipe: done
        (size,) = _HEADER.unpack(header)
        records = pickle.loads(inbox.read(size))
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
