"""Stopping a run on request: the first SIGINT/SIGTERM stops it gracefully, the second at once.

A terminal's Ctrl-C (SIGINT), a process worker cancelling a flow run (SIGTERM) and a plain
``kill`` all mean "stop now, but lose nothing". :class:`StopRequest` turns the first such signal
into a request the run loop honours: no new claims, requests in flight get a short grace, what
was fetched is settled, every other leased item goes back to the queue unchanged, locks are
released and the summary says the run was interrupted. A second signal means the user will not
wait: the process exits at once (``128 + signal``), and the next run recovers its leases
(:mod:`collector.run.heartbeat`).

Signal handlers can only be installed from the main thread, while the run's event loop may run
in another (Prefect runs some flows on a loop thread): the handler therefore only records the
request and wakes the registered callbacks on their own loops with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from collector.errors import CollectorError

if TYPE_CHECKING:
    from collector.run.summary import RunSummary

__all__ = [
    "EXIT_CODES",
    "EXIT_LOST_FOOTING",
    "LostFooting",
    "StopRequest",
    "StoppedWaiting",
    "process_footing",
    "process_stop",
]

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
"""Exit codes of a run stopped by a signal (128 + the signal number, as shells report them)."""

EXIT_LOST_FOOTING = 4
"""Exit code of a run (or helper) that lost a lease, its heartbeat or its source lock."""


class StoppedWaiting(CollectorError):
    """A stop was requested while the run waited for something (its source lock): it ends
    without having claimed anything."""

    def __init__(self, reason: str, waiting_for: str) -> None:
        super().__init__(f"interrupted by {reason} while waiting for {waiting_for}")
        self.reason = reason


class LostFooting(CollectorError):
    """The run lost what it stands on (a lease, its heartbeat, its source lock): it stopped
    claiming at once, settled what it still could, gave back the rest and ends Failed.

    Others may by then hold its items or its lock, so going on would work items that are no
    longer its own; the next run starts from an exact frontier (fencing refused whatever this
    run could no longer write).
    """

    def __init__(self, lost: str) -> None:
        super().__init__(f"stopped: lost {lost}; run again to continue")
        self.lost = lost
        # what it settled before it stopped (the flow sets it once published), so `collector
        # run` shows the account beside the loss, as after any other ending
        self.summary: RunSummary | None = None

    def __reduce__(self) -> tuple[type[LostFooting], tuple[str]]:
        return LostFooting, (self.lost,)  # pickled (a Prefect result) as it was raised


class StopRequest:
    """A one-way flag: once requested, it stays requested (with the first reason given)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Ask every watcher to stop; safe from any thread and from a signal handler."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            watchers = list(self._watchers)
        for loop, callback in watchers:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nothing to stop
                loop.call_soon_threadsafe(callback)

    def reset(self) -> None:
        """Forget a request (a process that runs several flow runs, one after another)."""
        with self._lock:
            self.reason = None

    @contextlib.contextmanager
    def watch(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call ``callback`` on the running loop when a stop is requested (at once if it was)."""
        loop = asyncio.get_running_loop()
        entry = (loop, callback)
        with self._lock:
            self._watchers.append(entry)
            already = self.reason is not None
        if already:
            loop.call_soon(callback)
        try:
            yield
        finally:
            with self._lock:
                self._watchers.remove(entry)

    @contextlib.contextmanager
    def on_signals(
        self,
        signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
        *,
        on_second: Callable[[int], None] | None = None,
    ) -> Iterator[bool]:
        """Route ``signals`` to :meth:`request` while the block runs; yields whether it could.

        Only the main thread may install handlers; elsewhere nothing changes (yields False).
        The second signal calls ``on_second(signum)``, by default ``os._exit(128 + signum)``.
        """
        if threading.current_thread() is not threading.main_thread():
            yield False
            return
        second = on_second or _exit_now

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.requested:
                second(signum)
                return
            self.request(signal.Signals(signum).name)

        previous = {sig: signal.signal(sig, handle) for sig in signals}
        try:
            yield True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _exit_now(signum: int) -> None:
    os.write(2, b"collector: stopped at once; the next run takes back this run's leases\n")
    os._exit(128 + signum)


# Process-wide, as signals are; each holds a reason and the watchers of the runs now running
# (a watcher leaves when its run does), and is reset when a run starts: bounded.
process_stop = StopRequest()
"""The process's stop request, shared by the CLI (which installs the handlers) and the flow."""

process_footing = StopRequest()
"""The loss of the source lock, said by the thread that renews it (flows/_locks.py) to the run
loop (collector.run.drain); reset each time the lock is taken and released."""
