"""Per-host concurrency that follows the host's load: a window, like TCP's congestion window.

A host's window starts small (``start``) and grows while the host answers near its latency
floor: by one per answer at first (slow start: it doubles every round trip), by one per round
trip after the first cut. It is cut multiplicatively (``decrease``) on 429, 503, timeouts and
refused connections, and gently (x0.75) when the smoothed latency rises well above its floor
(``latency_factor`` times the floor *and* ``latency_margin_s`` above it: a fixed pool of
server workers shows as queueing, which adds latency, long before it shows as errors). The
window stays within [1, ``per_domain_concurrency``]. A cut applies to answers of requests sent
*after* the previous cut only, and more overload within a second of a cut is the same episode
(for timeouts and refused connections: until an answer comes back fine; 429 and 503: always,
since servers count rates over windows of a second or more), so one bad moment cuts once, not
once per request in flight.

A host that answers 429 above a rate it does not announce is not helped by a smaller window
when it answers in a millisecond (one request at a time is already too fast), so a 429 or 503
also starts *pacing*: requests are spaced to half the rate they went at, and that rate grows by
``ADAPTIVE_PACE_GROWTH`` per paced answer (multiplicative increase, a sawtooth whose peaks are
one 429 every ~140 requests). ``Retry-After`` is honoured as before by the retry policy.

Fixed mode (``limits.adaptive: false``) uses the same gate with the window pinned at
``per_domain_concurrency``. Nothing is shared between workers here: each worker's window is its
own share of the host (``shared_domain_concurrency`` still caps the sum).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Literal

from collector import defaults

if TYPE_CHECKING:
    from collector.config import AdaptiveSettings

__all__ = ["HostGate", "Signal"]

Signal = Literal["ok", "overload", "throttled", "other"]
"""What an answer says about load: ``throttled`` (429/503) also paces; ``other`` says nothing
(a 404, a parse-level failure)."""

_FLOOR_BUCKET_S = 10.0  # the latency floor is the minimum over the last 3 such buckets
_EWMA = 0.2  # weight of a new latency sample in the smoothed latency
_SETTLE_SAMPLES = 8  # answers after a cut before the smoothed latency is judged or floors
_RATE_SPAN_S = 1.0  # the send rate a 429 halves is measured over this long
_HOLD_S = 1.0  # after a cut, more overload is the same episode until an answer comes back fine
#               or this long has passed (servers count rates over windows of a second or more)


class HostGate:
    """At most ``limit`` requests in flight to one host; the limit may change at any time.

    An ``asyncio.Semaphore`` whose size moves: waiters are woken in order when the window
    grows or a request ends. With ``settings`` the window adapts (see the module docstring);
    without, it stays at ``ceiling``.
    """

    def __init__(self, ceiling: int, settings: AdaptiveSettings | None = None) -> None:
        self.ceiling = ceiling
        self.settings = settings if settings is not None and settings.enabled else None
        start = self.settings.start if self.settings is not None else ceiling
        self.window = float(max(1, min(start, ceiling)))
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # adaptive state
        self.slow_start = True
        self.floor = math.inf
        self._floors: deque[tuple[float, float]] = deque()  # (bucket start, min latency)
        self.latency = 0.0  # smoothed
        self.samples = 0  # answers smoothed since the last cut
        self.cut_at = -math.inf  # monotonic time of the last cut
        self.cuts = 0
        self.recovered = True  # an answer came back fine since the last cut
        self.rate: float | None = None  # paced requests per second, once throttled
        self.paced_at = -math.inf  # monotonic time of the last pacing cut
        self._next_send = 0.0
        self._sends: deque[float] = deque()

    @property
    def limit(self) -> int:
        return max(1, min(self.ceiling, int(self.window)))

    # --- the gate ----------------------------------------------------------------------------
    async def acquire(self) -> bool:
        """Wait for a slot (and, when paced, for the next send time); True when it was paced."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # _wake counted us in before waking us
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release()  # woken and cancelled at once: give the slot on
                else:
                    self._waiters.remove(waiter)
                raise
        if self.settings is None:
            return False
        paced = False
        # Paced: take the next send time when it comes (not in advance), so a rate cut applies
        # to every request still waiting, not only to those that ask after it.
        while self.rate is not None and (now := time.monotonic()) < self._next_send:
            paced = True
            try:
                await asyncio.sleep(self._next_send - now)
            except asyncio.CancelledError:
                self.release()
                raise
        now = time.monotonic()
        if self.rate is not None:
            self._next_send = max(now, self._next_send) + 1.0 / self.rate
        self._sends.append(now)
        while self._sends and self._sends[0] < now - _RATE_SPAN_S:
            self._sends.popleft()
        return paced

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)

    # --- adapting ----------------------------------------------------------------------------
    def observe(self, signal: Signal, *, sent_at: float, latency_s: float, paced: bool) -> None:
        """One answer (or failure) of a request sent at ``sent_at`` (monotonic)."""
        settings = self.settings
        if settings is None or signal == "other":
            return
        if signal == "ok":
            self._sample(latency_s)
        if signal == "throttled":
            # Paced on its own clock: the server's rate window remembers a burst for a second
            # or more, so 429s within _HOLD_S of the last pacing cut are the same episode.
            if sent_at >= self.paced_at and time.monotonic() - self.paced_at >= _HOLD_S:
                self._pace()
                self._cut(settings.decrease)
            return
        if sent_at < self.cut_at:
            return  # sent before the last cut: that cut already answered for it
        if signal == "overload":
            if not self.recovered and time.monotonic() - self.cut_at < _HOLD_S:
                return  # the same episode
            self._cut(settings.decrease)
            return
        self.recovered = True  # answered well after the last cut: a new overload is news
        floor = self.floor
        if (
            self.samples >= _SETTLE_SAMPLES
            and self.latency > floor * settings.latency_factor
            and self.latency > floor + settings.latency_margin_s
        ):
            self._cut(defaults.ADAPTIVE_LATENCY_DECREASE)
            return
        if paced and self.rate is not None:
            self.rate *= 1 + defaults.ADAPTIVE_PACE_GROWTH
        if self.in_flight >= self.limit - 1:  # only a window in use may grow
            self.window = min(
                float(self.ceiling), self.window + (1.0 if self.slow_start else 1.0 / self.window)
            )
            self._wake()

    def _sample(self, latency_s: float) -> None:
        """Smooth the latency; its floor is the lowest *smoothed* value of the last 30 s.

        Smoothed against smoothed: a single lucky answer would set a floor that the mean
        latency of an idle host already exceeds twice over.
        """
        self.samples += 1
        self.latency = latency_s if self.samples == 1 else (
            (1 - _EWMA) * self.latency + _EWMA * latency_s
        )  # fmt: skip
        if self.samples < _SETTLE_SAMPLES:
            return
        now = time.monotonic()
        if not self._floors or now - self._floors[-1][0] >= _FLOOR_BUCKET_S:
            self._floors.append((now, self.latency))
            while len(self._floors) > 3:
                self._floors.popleft()
        elif self.latency < self._floors[-1][1]:
            self._floors[-1] = (self._floors[-1][0], self.latency)
        self.floor = min(low for _, low in self._floors)

    def _cut(self, factor: float) -> None:
        self.slow_start = False
        self.window = max(1.0, self.window * factor)
        self.cut_at = time.monotonic()
        self.recovered = False
        self.cuts += 1
        self.samples = 0  # judge the new window by its own answers

    def _pace(self) -> None:
        now = time.monotonic()
        # Sends over the last second (or since the first, early on, but at least 0.1 s of it).
        span = min(_RATE_SPAN_S, max(now - self._sends[0], 0.1)) if self._sends else 1.0
        sent_rate = max(len(self._sends) / span, 1.0 / _RATE_SPAN_S)
        current = sent_rate if self.rate is None else min(self.rate, sent_rate)
        assert self.settings is not None
        self.rate = max(current * self.settings.decrease, 0.1)
        self.paced_at = now
