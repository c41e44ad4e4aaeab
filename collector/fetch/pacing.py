"""Pacing a host that throttles: slow down only as far as its answers show that the rate is why.

A host answers some requests 429 or 503 ("throttled"). Two very different hosts do that:

* one that counts requests and refuses those above a rate (a token bucket): its share of
  throttled answers *falls* when we send slower;
* one with a little noise (a busy backend now and then, a cache miss): its share is the same at
  every rate, and sending slower only loses pages.

So the pacer judges the host by *epochs*: stretches of at least ``EPOCH_S`` seconds and
``EPOCH_ANSWERS`` sends (or ``EPOCH_MAX_S`` with at least one). An epoch stops taking sends when
it is due and is judged once every request sent within it has answered (or ``SETTLE_MAX_S``
after it stopped): a 503 comes back in a millisecond where a page takes 300 ms, so an epoch
judged by the answers it happened to have would count the fast failures and miss the slow
successes sent beside them, and read noise as a limit on exactly the loaded box where latency
is highest. Servers count rates over a second or more, so nothing is judged on less. Then:

1. **Excess?** The host's *noise* is the throttled share it shows whatever the rate (0 until
   measured). An epoch is in excess when its throttled answers exceed what the noise explains
   by more than 1 % of its answers and by more than two standard deviations (``2 sqrt(expected
   + 1)``), and at least two were throttled.
2. **Cut, then test.** An epoch in excess cuts the rate to ``CUT`` x the rate the host
   *accepted* in it (sends/s x the share not throttled: a token bucket's own rate, when it is
   one; but by at most half in one epoch, since bursts understate it), never below ``floor``
   unless the rate is already at the floor and still in excess.
   The epochs after it run at the cut rate and are the test, against the share of the epoch
   that caused the cut pooled with the two clean epochs before it (the loud epoch alone was
   picked for being loud: noise loud once is quieter next time at any rate, a limit is loud
   in all three). If the throttled share since the cut is more than half of that, it is
   noise: the cut is undone (the rate goes back to what it was, unpaced when it was) and the
   share of all those epochs becomes the host's noise, so that share no longer counts as
   excess. If it is at most half
   *and* lower beyond chance (a two-proportion z of at least ``Z_FELL``: 6 of 30 against 2 of
   30 is not, 9 of 109 against 0 of 91 is), or still ``NOISE_MAX`` or more (no noise is that
   loud), the rate was the cause and the cut stands. Lower but within chance, the next epoch
   adds to the test, up to ``TEST_EPOCHS``; lower through all of them, the cut stands. Noise
   that comes in clusters (a section of a site, a batch whose first pages all fail) makes one
   epoch loud and the next quiet by chance; the z test is what keeps one such pair from
   passing as a limit, and a limit just overshot (3 % throttled) is not let go on one quiet
   epoch.
3. **Grow in time.** A paced rate grows with the clock, not per answer: ``GROWTH_SLOW`` per
   second up to ``KNEE`` x the rate the host accepted when it was cut (for ``GROWTH_SLOW_S``
   after a cut undone), a sawtooth that sits just under a real limit; past that knee
   the growth per second doubles every second (3, 6, 12, 25, 50, 100 %/s...: gentle where the
   limit was, and a limit that went away, or a noise cut that stood by chance, is left behind
   within seconds: x100 in about 8 s). The rate never runs more than ``PROVEN_X`` (2x) ahead
   of the fastest clean epoch since the cut, so an idle spell (a batch waiting for its last
   retries) does not grow it untested; a host whose limit went away doubles it each epoch.
   Pacing ends once the rate reaches ``END_X`` (8x) the rate the host accepted at the cut.
4. Clean epochs move the noise estimate towards their share (a weight of ``NOISE_WEIGHT``), so
   noise that goes away stops being tolerated.

**Degrade** (:class:`Degrade`, ``retry.degrade_share``) is the blunter answer beside pacing:
while a host answers 429 (for ``degrade_hold_s`` after its last one), only that share of its
requests is sent; the rest go back to the frontier, due once the degrade ends (not attempts,
never failed).

``Retry-After`` is not read here: the retry policy (collector.policy.retry) makes the item wait
at least that long. Everything takes ``now`` (monotonic seconds) explicitly, so tests run it on
virtual time.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from collector import defaults

__all__ = ["Degrade", "Pacing"]

_LN2 = math.log(2)
EPOCH_S = 1.0  # an epoch lasts at least this long...
EPOCH_ANSWERS = 30  # ...and holds at least this many sends,
EPOCH_MAX_S = 10.0  # or, on a slow host, lasts this long with at least one
SETTLE_MAX_S = 30.0  # an epoch is judged with the answers it has this long after its last send
Z_FELL = 2.5  # a cut stands when the share fell by at least this many standard errors...
TEST_EPOCHS = 3  # ...or stayed below half of it for this many epochs
NOISE_MAX = 0.25  # a share this high is never taken for noise: the host is limited, whatever
CUT = 0.9  # a cut paces at this share of the rate the host accepted
GROWTH_SLOW = 0.03  # a paced rate grows 3 %/s up to KNEE x the rate accepted at the last cut
KNEE = 1.1
GROWTH_SLOW_S = 10.0  # ...or for this long when that rate is not known (a cut undone)
PROVEN_X = 2  # a paced rate stays within 2x the fastest clean epoch since the cut...
END_X = 8  # ...and pacing ends once it reaches 8x the rate the host accepted at the cut
NOISE_WEIGHT = 0.1  # a clean epoch's share moves the noise estimate by this weight
MIN_RATE = 0.05  # requests/s: the slowest pace, for a host that throttles even at the floor


@dataclass(slots=True)
class _Epoch:
    start: float
    end: float = math.inf  # sends from ``end`` on belong to the next epoch
    sends: int = 0
    answers: int = 0
    throttled: int = 0
    paced: bool = False  # a paced rate applied during it

    def share(self) -> float:
        return self.throttled / self.answers if self.answers else 0.0

    def holds(self, sent_at: float) -> bool:
        return self.start <= sent_at < self.end


def fell_beyond_chance(high: int, high_n: int, low: int, low_n: int) -> bool:
    """Whether ``low / low_n`` is below ``high / high_n`` by at least ``Z_FELL`` standard errors
    (the pooled two-proportion z test), and at most half of it."""
    if high_n == 0 or low_n == 0:
        return False
    p_high, p_low = high / high_n, low / low_n
    if p_low > p_high / 2:
        return False
    pooled = (high + low) / (high_n + low_n)
    error = math.sqrt(pooled * (1 - pooled) * (1 / high_n + 1 / low_n))
    return error > 0 and (p_high - p_low) / error >= Z_FELL


@dataclass(slots=True)
class _Test:
    """A cut waiting for its test: what the rate was, what caused the cut, and what the epochs
    since the cut (up to ``TEST_EPOCHS``) answered."""

    rate_before: float | None  # None: unpaced
    sent_rate: float
    share: float
    answers: int
    throttled: int
    epochs: int = 0  # test epochs judged so far
    after_answers: int = 0
    after_throttled: int = 0
    after_sends: int = 0
    after_s: float = 0.0

    def add(self, epoch: _Epoch, elapsed: float) -> tuple[float, float]:
        """Count one more test epoch in; returns (its sends/s, the throttled share since the
        cut)."""
        self.epochs += 1
        self.after_answers += epoch.answers
        self.after_throttled += epoch.throttled
        self.after_sends += epoch.sends
        self.after_s += elapsed
        return self.after_sends / self.after_s, self.after_throttled / self.after_answers


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why a host is paced: the throttled share at the rate that caused the cut and after."""

    high_rate: float
    high_share: float
    low_rate: float
    low_share: float


class Pacing:
    """The paced rate of one host (None: not paced) and the evidence behind it."""

    def __init__(self, floor: float = defaults.ADAPTIVE_RATE_FLOOR) -> None:
        self.floor = floor
        self.noise = 0.0  # the host's throttled share at any rate
        self.cuts = 0
        self.undone = 0  # cuts found to be noise and undone
        self.evidence: Evidence | None = None  # the last test that showed the rate as the cause
        self._base: float | None = None  # the rate at ``_since``
        self._since = 0.0
        self._slow_s = GROWTH_SLOW_S  # seconds of slow growth from ``_since``
        self._proven = 0.0  # the fastest sends/s of a clean epoch since ``_since`` (or the cut)
        self._limit = 0.0  # the rate the host accepted at the cut (or the rate restored)
        self._epoch: _Epoch | None = None  # taking sends
        self._settling: deque[_Epoch] = deque()  # done sending, waiting for their answers
        self._history: deque[_Epoch] = deque(maxlen=2)  # the last clean epochs judged
        self._test: _Test | None = None

    # --- the rate ------------------------------------------------------------------------------
    def rate(self, now: float) -> float | None:
        """Requests per second to pace at ``now``, or None when not paced."""
        if self._base is None:
            return None
        elapsed = max(0.0, now - self._since)
        slow = min(elapsed, self._slow_s)
        fast = elapsed - slow
        # past the knee the growth per second doubles each second (3, 6, 12, 25, 50, 100 %...)
        exponent = slow * math.log1p(GROWTH_SLOW) + GROWTH_SLOW * (2 ** min(fast, 30) - 1) / _LN2
        growth = math.exp(min(exponent, 50.0))
        return min(self._base * growth, PROVEN_X * self._proven)

    def _set(self, rate: float | None, now: float, accepted: float | None = None) -> None:
        """Pace at ``rate`` from ``now``; slow growth lasts until KNEE x ``accepted``."""
        self._base = rate
        self._since = now
        self._slow_s = GROWTH_SLOW_S
        self._proven = rate or 0.0
        self._limit = accepted if accepted is not None else (rate or 0.0)
        if rate is not None and accepted is not None:
            ratio = max(KNEE * accepted / rate, 1.0)
            self._slow_s = math.log(ratio) / math.log(1 + GROWTH_SLOW)

    @property
    def testing(self) -> bool:
        """A cut is waiting for its test epoch."""
        return self._test is not None

    # --- what happened -------------------------------------------------------------------------
    def sent(self, now: float) -> None:
        """A request goes to the host now (call it when the request is sent, not queued)."""
        self._maybe_close(now)  # first: a send at ``now`` belongs to the epoch holding ``now``
        epoch = self._current(now)
        epoch.sends += 1
        if self._base is not None:
            epoch.paced = True

    def unanswered(self, *, sent_at: float, now: float) -> None:
        """A request sent at ``sent_at`` will never answer (its batch was cancelled)."""
        epoch = self._epoch_of(sent_at)
        if epoch is not None:
            epoch.sends = max(epoch.answers, epoch.sends - 1)
        self._judge_settled(now)

    def answered(self, *, throttled: bool, sent_at: float, now: float) -> None:
        """One answer to a request sent at ``sent_at``; it counts in the epoch it was sent in."""
        epoch = self._epoch_of(sent_at)
        if epoch is not None:
            epoch.answers += 1
            epoch.throttled += throttled
        self._maybe_close(now)
        self._judge_settled(now)

    def _current(self, now: float) -> _Epoch:
        if self._epoch is None:
            self._epoch = _Epoch(now)
        return self._epoch

    def _epoch_of(self, sent_at: float) -> _Epoch | None:
        """The epoch a send belongs to; None for sends of an epoch judged or dropped."""
        if self._epoch is not None and self._epoch.start <= sent_at:
            return self._epoch
        for epoch in self._settling:
            if epoch.holds(sent_at):
                return epoch
        return None

    def _maybe_close(self, now: float) -> None:
        """Stop the epoch taking sends once it is due; it is judged when its answers are in."""
        epoch = self._epoch
        if epoch is None:
            return
        elapsed = now - epoch.start
        due = (elapsed >= EPOCH_S and epoch.sends >= EPOCH_ANSWERS) or (
            elapsed >= EPOCH_MAX_S and epoch.sends >= 1
        )
        if due:
            epoch.end = now
            self._settling.append(epoch)
            self._epoch = _Epoch(now)

    def _judge_settled(self, now: float) -> None:
        """Judge, oldest first, the epochs whose every send answered (or that waited too long)."""
        while self._settling:
            epoch = self._settling[0]
            if epoch.answers < epoch.sends and now - epoch.end < SETTLE_MAX_S:
                return
            self._settling.popleft()
            if epoch.answers == 0:
                continue
            if self._judge(epoch, max(epoch.end - epoch.start, 1e-3), now):
                # The rate changed: epochs sent partly at the old one tell nothing of the new.
                self._settling.clear()
                self._epoch = _Epoch(now)
                return

    # --- the decision --------------------------------------------------------------------------
    def _judge(self, epoch: _Epoch, elapsed: float, now: float) -> bool:
        """Judge one settled epoch; True when the rate changed (a cut, or a cut undone)."""
        sent_rate = epoch.sends / elapsed
        share = epoch.share()
        test = self._test
        if test is not None:
            low_rate, low_share = test.add(epoch, elapsed)
            fell = fell_beyond_chance(
                test.throttled, test.answers, test.after_throttled, test.after_answers
            )
            if not fell and low_share > test.share / 2 and low_share < NOISE_MAX:
                # Not lower at the lower rate: noise. Undo the cut, learn the share.
                pooled = (test.throttled + test.after_throttled) / (
                    test.answers + test.after_answers
                )
                self.noise = min(pooled, NOISE_MAX)
                self.undone += 1
                self._test = None
                self._set(test.rate_before, now)
                return True
            if not fell and low_share < NOISE_MAX and test.epochs < TEST_EPOCHS:
                return False  # lower, but within chance yet: the next epoch adds to the test
            # Clearly lower (or still loud, or lower through every test epoch): the rate was
            # the cause, and the cut stands.
            self._test = None
            self._history.clear()
            self.evidence = Evidence(test.sent_rate, test.share, low_rate, low_share)
        if self._excess(epoch):
            current = self.rate(now)
            # Never below half the rate sent: bursty sends (retries released together by a
            # Retry-After) make a bucket look stingier than it is; if half is still too fast,
            # the next epoch is in excess too and cuts again.
            accepted = sent_rate * max(1 - share, 0.5)
            cut = max(accepted * CUT, MIN_RATE)
            # at the floor: the last cut set it there, and this epoch (run from it) is in excess
            at_floor = self._base is not None and self._base <= self.floor * 1.01
            if not at_floor:
                cut = max(cut, self.floor)
            # The share the test compares with: this epoch's and the two before it. This one
            # alone was picked for being loud, and noise that is loud once is quieter next
            # time whatever the rate; a limit is loud in all of them.
            answers = epoch.answers + sum(e.answers for e in self._history)
            throttled = epoch.throttled + sum(e.throttled for e in self._history)
            self._test = _Test(current, sent_rate, throttled / answers, answers, throttled)
            self._history.clear()
            self.cuts += 1
            self._set(cut, now, accepted)
            return True
        # A clean epoch: noise drifts towards its share; the rate sent proves what is safe, and
        # pacing ends once the rate is far past the limit that was found.
        self._history.append(epoch)
        self.noise += NOISE_WEIGHT * (share - self.noise)
        if self._base is not None:
            self._proven = max(self._proven, sent_rate)
            current = self.rate(now)
            if current is not None and current >= END_X * self._limit:
                self._set(None, now)
        return False

    def _excess(self, epoch: _Epoch) -> bool:
        expected = epoch.answers * self.noise
        over = epoch.throttled - expected
        return (
            epoch.throttled >= 2
            and over > 0.01 * epoch.answers
            and over > 2 * math.sqrt(expected + 1)
        )


class Degrade:
    """One host's 429 degrade: for ``hold_s`` after its last 429, each request is sent with
    probability ``share`` and the others are handed back (wall-clock seconds, as ``not_before``).
    """

    __slots__ = ("handed_back", "hold_s", "sent", "share", "until")

    def __init__(self, share: float, hold_s: float) -> None:
        self.share = share
        self.hold_s = hold_s
        self.until = 0.0  # the degrade lasts until then (extended by each 429)
        self.sent = 0  # requests let through while degraded
        self.handed_back = 0

    def throttled(self, now: float) -> None:
        """The host answered 429 at ``now``."""
        self.until = max(self.until, now + self.hold_s)

    def admit(self, now: float, rng: random.Random) -> float | None:
        """None: send the request; else the time to hand it back until (the degrade's end,
        spread over one hold so the handed-back requests do not all come back at once)."""
        if now >= self.until:
            return None
        if rng.random() < self.share:
            self.sent += 1
            return None
        self.handed_back += 1
        return self.until + rng.uniform(0.0, self.hold_s)
