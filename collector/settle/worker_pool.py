"""Idle GX validation worker processes kept for the next run of the same suite, per process.

A worker's start costs GX's import (~3 s of CPU, more on a loaded box); a process that runs
several collects (the fleet, a served deployment, a test session) paid it once per run. Here a
run's worker, healthy and idle at the run's end, waits for the next run whose suite file has the
same bytes (:func:`suite_digest`, the same idea as :mod:`collector.settle.gx_check_cache`): the
key is the content, never the path, so an edited suite never gets a worker built from its old
text, and the same text under another path does.

What is kept, and for how long:

* **One owner at a time.** :meth:`WorkerPool.take` removes the worker from the pool; two runs
  at once each get a worker of their own (the second starts one). Only the run that took a
  worker gives it back, and only when it is known to be between requests (see
  :class:`collector.settle.validation_worker.ValidationWorker`): a worker that died, answered
  with an error, or may still be in a request (the run was cancelled or interrupted mid-call)
  is closed instead.
* **Bounded.** At most :data:`IDLE_MAX` idle workers; giving back one more closes the one idle
  longest. A worker found dead when taken (killed while idle) is reaped and not handed out.
* **Closed at exit.** ``atexit`` closes every idle worker's pipe and waits briefly for it; one
  still starting (prewarmed, never greeted: it has had no request) is killed at once instead of
  waited for through the rest of GX's import (:func:`close_idle`). A process that ends without
  ``atexit`` (SIGKILL) closes the pipes anyway, and a worker ends by itself when its pipe
  closes. A forked child never uses its parent's workers (their pipes are
  the parent's): it starts with an empty pool.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IDLE_MAX", "Idle", "WorkerPool", "close_idle", "close_process", "pool", "suite_digest"]

IDLE_MAX = 2
"""Idle workers kept per process (each holds GX in memory, ~250 MB)."""


def suite_digest(suite_path: str | Path) -> str | None:
    """The key of a suite file's content (None: unreadable, so nothing is shared for it)."""
    try:
        data = Path(suite_path).read_bytes()
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Idle:
    """A worker between runs: ``greeted`` once its ready frame was read (then ``digest`` is the
    content it says it built; before that, what the file held when it was started)."""

    process: subprocess.Popen[bytes]
    digest: str
    greeted: bool


def close_process(process: subprocess.Popen[bytes], wait_s: float = 5.0) -> None:
    """Close the worker's pipe (it ends at its next read), wait for it, kill it if it lingers."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()


def close_idle(idle: Idle, wait_s: float = 5.0) -> None:
    """Close an idle worker: politely once greeted; at once (SIGKILL) while still starting.

    A worker not yet greeted has never had a request (the ready frame is read before the
    first one), so it holds nothing to lose; it is still importing GX and reads its pipe only
    when done, so closing the pipe and waiting would hold the caller (a run's exit) for the
    rest of GX's import, ~3 s of CPU spent for nothing: a run with nothing to validate (every
    item fresh) paid it at exit.
    """
    if not idle.greeted:
        with contextlib.suppress(OSError):
            idle.process.kill()
    close_process(idle.process, wait_s)


class WorkerPool:
    """The idle workers of this process, by suite content, oldest first."""

    def __init__(self, keep: int = IDLE_MAX) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[Idle] = []
        self._pid = os.getpid()
        self._inherited: list[Idle] = []  # a forked child's copy: never used, never closed

    def _own(self) -> None:
        """Called under the lock: in a forked child, forget the parent's workers."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._inherited.extend(self._idle)
            self._idle = []

    def take(self, digest: str) -> Idle | None:
        """An idle worker for this content (the most recently given back), now the caller's."""
        dead: list[Idle] = []
        found = None
        with self._lock:
            self._own()
            for index in range(len(self._idle) - 1, -1, -1):
                idle = self._idle[index]
                if idle.digest != digest:
                    continue
                del self._idle[index]
                if idle.process.poll() is None:
                    found = idle
                    break
                dead.append(idle)
        for idle in dead:
            close_process(idle.process)
        return found

    def give(self, idle: Idle) -> None:
        """Keep ``idle`` for the next run of its content; close the oldest beyond the bound."""
        with self._lock:
            self._own()
            self._idle.append(idle)
            excess = max(0, len(self._idle) - self.keep)
            evicted, self._idle = self._idle[:excess], self._idle[excess:]
        for old in evicted:
            close_idle(old)

    def has(self, digest: str) -> bool:
        with self._lock:
            self._own()
            return any(idle.digest == digest for idle in self._idle)

    def idle(self) -> list[Idle]:
        """The idle workers, oldest first (for tests and diagnostics)."""
        with self._lock:
            self._own()
            return list(self._idle)

    def close_all(self, wait_s: float = 2.0) -> None:
        """Close every idle worker (at exit, and for tests that want a clean slate)."""
        with self._lock:
            self._own()
            idle, self._idle = self._idle, []
        for worker in idle:
            close_idle(worker, wait_s)


pool = WorkerPool()
atexit.register(pool.close_all)
