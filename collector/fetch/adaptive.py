"""Per-host concurrency that follows the host's load: a window, like TCP's congestion window.

A host's window starts small (``start``) and grows while the host answers near its latency
floor: by one per answer at first (slow start: it doubles every round trip), by one per round
trip after the first cut. It is cut multiplicatively (``decrease``) on timeouts, refused
connections, 502 and 504 (unless the host answered well a request sent *after* the one that
failed, or the page failed the same way before: then it is that page's trouble, a slow page on
a host that serves every other one at once), and gently (x0.75) when the smoothed latency rises
well above its floor (``latency_factor`` times the floor *and* ``latency_margin_s`` above it: a
fixed pool of server workers shows as queueing, which adds latency, long before it shows as
errors; our own loop's lateness is taken out first, :mod:`collector.fetch.looplag`). The window
stays within [1, ``per_domain_concurrency``]. A cut applies to answers of requests sent *after*
the previous cut only, and more overload within a second of a cut is the same episode until an
answer comes back fine, so one bad moment cuts once, not once per request in flight.

Throttling (429, 503) does not touch the window: it is judged by the host's *pacing*
(:mod:`collector.fetch.pacing`), which spaces requests to a rate only when the host's share of
throttled answers falls as the rate falls (a real limit), and leaves a host whose share is the
same at every rate (noise) unpaced. A paced rate grows with the clock, so it recovers in seconds
after the throttling stops. ``Retry-After`` is honoured by the retry policy, per item.

:meth:`HostGate.slowdown` says in one line whether, and why, a host is held back (the run's
progress line and its end-of-run lines).

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
from collector.fetch.pacing import Pacing

if TYPE_CHECKING:
    from collector.config import AdaptiveSettings

__all__ = ["HostGate", "Signal"]

Signal = Literal["ok", "overload", "throttled", "other"]
"""What an answer says about load: ``throttled`` (429/503) counts towards pacing only;
``other`` (a 404, a parse-level failure) counts as an answer that was not throttled."""

_FLOOR_BUCKET_S = 10.0  # the latency floor is the minimum over the last 3 such buckets
_EWMA = 0.2  # weight of a new latency sample in the smoothed latency
_HELD_BACK_X = 0.9  # a window below this share of its ceiling is reported as held back: one
#                     cut long answered and regrown to 15 of 16 (a window grows only while in
#                     use, so at a run's end it often stops short) is not a slowed host
_SETTLE_SAMPLES = 8  # answers after a cut before the smoothed latency is judged or floors
_HOLD_S = 1.0  # after a cut, more overload is the same episode until an answer comes back fine
#               or this long has passed
_OVERLOADED_KEPT = 1_024  # pages remembered as timing out, per host (oldest forgotten first)


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
        self.limit = 1  # requests allowed in flight now: the window, whole, in [1, ceiling]
        self.window = float(max(1, min(start, ceiling)))
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # adaptive state
        self.slow_start = True
        self.floor = math.inf
        self._floors: deque[tuple[float, float]] = deque()  # (bucket start, min latency)
        self.latency = 0.0  # smoothed, our own loop's lateness taken out (what is judged)
        self._raw = 0.0  # smoothed as measured (what the floor is learnt from)
        self.samples = 0  # answers smoothed since the last cut
        self.cut_at = -math.inf  # monotonic time of the last cut
        self.cuts = 0
        self.recovered = True  # an answer came back fine since the last cut
        self.cause = ""  # what made the last window cut: "latency" or "overload"
        self.pacing = Pacing()
        self._next_send = 0.0
        self._ok_sent_at = -math.inf  # the latest send time of a request answered well
        # pages whose last answer was an overload (insertion-ordered, bounded)
        self._overloaded: dict[str, None] = {}

    @property
    def window(self) -> float:
        """The window (fractional: it grows by 1/window per round trip); :attr:`limit` is its
        whole part within [1, ceiling], kept beside it (read several times per request)."""
        return self._window

    @window.setter
    def window(self, value: float) -> None:
        self._window = value
        self.limit = max(1, min(self.ceiling, int(value)))

    @property
    def rate(self) -> float | None:
        """Paced requests per second now (None: not paced)."""
        return self.pacing.rate(time.monotonic()) if self.settings is not None else None

    def slowdown(self) -> str | None:
        """Why this host is held back, in one short line; None when it is not.

        Held back means paced (a 429/503 share that fell with the rate), or a window below 0.9
        of its ceiling after a cut (latency well above its floor, or timeouts and refused
        connections).
        A window still growing from its start, and a first cut being tested, are not held back
        (a later cut under test is: the host showed a limit before).
        """
        if self.settings is None:
            return None
        pacing = self.pacing
        rate = self.rate
        if rate is not None and (evidence := pacing.evidence) is not None:
            return (
                f"paced to {rate:.1f}/s after 429/503s (share {evidence.high_share:.0%} at "
                f"{evidence.high_rate:.0f}/s, {evidence.low_share:.0%} at "
                f"{evidence.low_rate:.0f}/s)"
            )
        if self.slow_start or self.limit >= self.ceiling * _HELD_BACK_X:
            return None  # never cut, or grown back to within a tenth of its ceiling
        if self.cause == "latency" and self.floor < math.inf:
            # in ms, not as a ratio: with our own loop's lateness taken out, a fast host's
            # floor may be next to nothing (a ratio of millions said nothing)
            return (
                f"window {self.limit} of {self.ceiling}: latency {self.latency * 1000:.0f} ms, "
                f"its floor {self.floor * 1000:.0f} ms"
            )
        return f"window {self.limit} of {self.ceiling} after timeouts or refused connections"

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
        while (rate := self.pacing.rate(now := time.monotonic())) is not None and (
            now < self._next_send
        ):
            paced = True
            try:
                await asyncio.sleep(self._next_send - now)
            except asyncio.CancelledError:
                self.release()
                raise
        if rate is not None:
            self._next_send = max(now, self._next_send) + 1.0 / rate
        return paced

    def sent(self) -> float:
        """The request goes now (after every other wait): returns its send time, the
        ``sent_at`` to give :meth:`observe` or :meth:`unanswered`."""
        now = time.monotonic()
        if self.settings is not None:
            self.pacing.sent(now)
        return now

    def unanswered(self, sent_at: float) -> None:
        """A request that was sent will never answer (its batch was cancelled)."""
        if self.settings is not None:
            self.pacing.unanswered(sent_at=sent_at, now=time.monotonic())

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
    def observe(
        self,
        signal: Signal,
        *,
        sent_at: float,
        latency_s: float,
        paced: bool,
        url: str | None = None,
        raw_latency_s: float | None = None,
    ) -> None:
        """One answer (or failure) of a request sent at ``sent_at`` (monotonic).

        ``latency_s`` is judged against the floor; with ``raw_latency_s`` (the same answer's
        latency before our own loop's lateness was taken out) the floor is learnt from the raw
        figures instead. The discount may only ever lower what is judged, never the floor: a
        discount as large as a busy moment's (a batch of a thousand tasks starting) would
        otherwise set a floor below the host's real best, and the host's ordinary latency would
        then read as twice it (a 100-300 ms host was cut to a window of 3 beside a 20/s one).

        With ``url``, a page that times out (or is refused) again is not read as the host's
        load a second time: one slow page retried three times is one page's trouble, and would
        otherwise cut the window of a host that serves every other page at once.
        """
        settings = self.settings
        if settings is None:
            return
        now = time.monotonic()
        self.pacing.answered(throttled=signal == "throttled", sent_at=sent_at, now=now)
        if url is not None:
            signal = self._first_overload(signal, url)
        if signal in ("throttled", "other"):
            return
        if signal == "ok":
            self._sample(latency_s, latency_s if raw_latency_s is None else raw_latency_s)
            self._ok_sent_at = max(self._ok_sent_at, sent_at)
        if sent_at < self.cut_at:
            return  # sent before the last cut: that cut already answered for it
        if signal == "overload" and sent_at < self._ok_sent_at:
            return  # the host answered a request sent after this one: the page's trouble
        if signal == "overload":
            if not self.recovered and now - self.cut_at < _HOLD_S:
                return  # the same episode
            self._cut(settings.decrease, "overload")
            return
        self.recovered = True  # answered well after the last cut: a new overload is news
        floor = self.floor
        if (
            self.samples >= _SETTLE_SAMPLES
            and self.latency > floor * settings.latency_factor
            and self.latency > floor + settings.latency_margin_s
        ):
            self._cut(defaults.ADAPTIVE_LATENCY_DECREASE, "latency")
            return
        if self.in_flight >= self.limit - 1:  # only a window in use may grow
            self.window = min(
                float(self.ceiling), self.window + (1.0 if self.slow_start else 1.0 / self.window)
            )
            self._wake()

    def _first_overload(self, signal: Signal, url: str) -> Signal:
        """``overload`` for a page's first overload, ``other`` for its repeats; an answer that
        is not an overload forgets the page."""
        if signal != "overload":
            self._overloaded.pop(url, None)
            return signal
        if url in self._overloaded:
            return "other"
        self._overloaded[url] = None
        if len(self._overloaded) > _OVERLOADED_KEPT:
            del self._overloaded[next(iter(self._overloaded))]
        return signal

    def _sample(self, latency_s: float, raw_latency_s: float) -> None:
        """Smooth the latency (judged) and the raw latency; the floor is the lowest *smoothed*
        raw value of the last 30 s.

        Smoothed against smoothed: a single lucky answer would set a floor that the mean
        latency of an idle host already exceeds twice over.
        """
        self.samples += 1
        if self.samples == 1:
            self.latency, self._raw = latency_s, raw_latency_s
        else:
            self.latency = (1 - _EWMA) * self.latency + _EWMA * latency_s
            self._raw = (1 - _EWMA) * self._raw + _EWMA * raw_latency_s
        if self.samples < _SETTLE_SAMPLES:
            return
        now = time.monotonic()
        if not self._floors or now - self._floors[-1][0] >= _FLOOR_BUCKET_S:
            self._floors.append((now, self._raw))
            while len(self._floors) > 3:
                self._floors.popleft()
        elif self._raw < self._floors[-1][1]:
            self._floors[-1] = (self._floors[-1][0], self._raw)
        self.floor = min(low for _, low in self._floors)

    def _cut(self, factor: float, cause: str) -> None:
        self.slow_start = False
        self.cause = cause
        self.window = max(1.0, self.window * factor)
        self.cut_at = time.monotonic()
        self.recovered = False
        self.cuts += 1
        self.samples = 0  # judge the new window by its own answers
