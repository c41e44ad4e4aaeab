"""A holder's heartbeat: how a run or helper tells the others it is alive.

Leases alone say "held until T"; with the default ``lease_s`` of 600 s a dead holder would keep
its items for up to ten minutes. Every run and helper therefore claims under its own holder id
and records a heartbeat in the frontier every ``HEARTBEAT_S``; a holder silent for
``HOLDER_DEAD_AFTER_S`` is dead, and whoever notices revokes its leases at once
(:meth:`Frontier.revoke`). Its items go back to the queue unchanged, and their next claim takes a
new fencing token, so a holder that was only paused (SIGSTOP, a VM freeze) cannot ack or write
them when it wakes up: the fence refuses it, as after an expired lease.

The beat runs on a thread, not on the run's event loop, so a loop busy with a large settle does
not look like death; the run loop enters it with ``async with``, so even the first beat and the
last join leave the loop free (collector.offloop).

A holder whose own beats fail is told so (``on_lost``): a store error is retried every beat,
but once no beat went through for ``dead_after_s - every_s`` the others may already call it
dead and revoke its leases, and a beat thread that raised anything else beats no more. Either
way the holder must stop claiming rather than work items that may no longer be its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from collector import defaults
from collector.errors import CollectorError
from collector.frontier import Frontier
from collector.frontier.base import Holder

__all__ = ["Heartbeat", "HolderVerdict", "dead_holders", "judge_holders"]

log = logging.getLogger(__name__)


class Heartbeat:
    """Beat for ``holder`` every ``every_s`` seconds until stopped (use as a context manager)."""

    def __init__(
        self,
        frontier: Frontier,
        source: str,
        holder: str,
        *,
        every_s: float = defaults.HEARTBEAT_S,
        dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S,
        clock: Callable[[], float] = time.time,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.frontier = frontier
        self.source = source
        self.holder = holder
        self.every_s = every_s
        self.dead_after_s = dead_after_s
        self.clock = clock
        self.on_lost = on_lost
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{holder[:12]}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self.frontier.beat(self.source, self.holder, now=self.clock())  # alive before claiming
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=self.every_s + 5)

    async def __aenter__(self) -> Heartbeat:
        """:meth:`__enter__` off the event loop (its first beat is a store call)."""
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.__exit__)

    def _run(self) -> None:
        beaten = time.monotonic()  # the last beat that went through (monotonic: a clock jump
        # changes what the others read, not how long we have been silent)
        margin = max(self.every_s, self.dead_after_s - self.every_s)
        while not self._stopped.wait(self.every_s):
            try:
                self.frontier.beat(self.source, self.holder, now=self.clock())
                beaten = time.monotonic()
            except CollectorError as exc:  # a backend hiccup: the next beat may succeed
                silent = time.monotonic() - beaten
                if silent < margin:
                    log.warning("heartbeat of %s failed: %s", self.holder, exc)
                    continue
                self._lose(f"its heartbeat: no beat went through for {silent:.0f}s ({exc})")
                return
            except Exception as exc:
                if self._stopped.is_set():  # the frontier was closed under us: the run is ending
                    return
                said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self._lose(f"its heartbeat: the beat thread raised {said}")
                return

    def _lose(self, what: str) -> None:
        """Say the loss once: to the holder (``on_lost``), else in the log."""
        with contextlib.suppress(Exception):
            log.error("%s lost %s", self.holder, what)
        if self.on_lost is not None:
            self.on_lost(what)


@dataclass(frozen=True, slots=True)
class HolderVerdict:
    """Who of the other holders of a source is dead, and how many items live ones lease."""

    dead: list[str]
    live_leased: int


def judge_holders(
    holders: list[Holder],
    *,
    now: float,
    me: str = "",
    dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S,
) -> HolderVerdict:
    """Split the other holders into dead (heartbeat silent for ``dead_after_s``) and live.

    Anonymous leases and holders that never beat are neither: their leases expire.
    """
    dead: list[str] = []
    live_leased = 0
    for h in holders:
        if not h.holder or h.holder == me or h.beat_at is None:
            continue
        if now - h.beat_at > dead_after_s:
            dead.append(h.holder)
        else:
            live_leased += h.leased
    return HolderVerdict(dead, live_leased)


def dead_holders(
    frontier: Frontier,
    source: str,
    *,
    now: float,
    me: str = "",
    dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S,
) -> list[str]:
    """Holders of ``source``'s leases whose heartbeat stopped more than ``dead_after_s`` ago."""
    verdict = judge_holders(frontier.holders(source), now=now, me=me, dead_after_s=dead_after_s)
    return verdict.dead
