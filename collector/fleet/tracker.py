"""What the autoscaler keeps per source between decisions: claim wait, helpers' busy share,
how long the source has been short of helpers. Fed by frontier samples; Prefect-free.

The helpers report through the frontier itself: each helper claims under its own holder id
(its flow run id) and its leases show in :meth:`Frontier.holders`, so the busy share is the share
of samples in which a helper held leased items. A helper that waits for its frontier, for a
host's slots or for Prefect holds nothing and counts as idle.

The sustained-load windows (busy above ``busy_high``, busy below ``rules.idle_below``, memory
above ``rules.memory_high``) restart whenever the source's helper count changes: a scaling
step acts only on what held with the helpers it has now. The throughput (items/s one process
claims) is the claim rate over the processes that held leases, both over the window.

A helper's start is measured here too (:class:`Arrivals`): from the fleet's creating it to the
first sample in which its run id holds leases, into the fleet-wide :class:`HelperStarts`; and a
source's processes that are live but have not claimed yet (its helpers starting, its own run
still starting or planning) are its capacity on the way.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from collector import defaults
from collector.fleet.model import (
    ClaimWait,
    FleetSettings,
    Held,
    HelperStarts,
    ScalingRules,
    SourceLoad,
    gained,
)
from collector.frontier.base import Holder, StateCounts

__all__ = ["Arrivals", "Reservations", "SourceTracker"]


class Arrivals:
    """Which processes (flow run ids: a run claims under its own id) have claimed yet, and
    each start of a helper this fleet created, from its creation to its first claim.

    A process that has never held leases is on its way: it will claim sooner than a helper
    asked for now (which would start behind it), so a source with one coming asks for none on
    "nothing claims". One that has taken more than ``coming_for`` x the expected start is not
    counted on any more (a run stuck in its lock wait, a worker that is gone).
    """

    def __init__(self, starts: HelperStarts, coming_for: float = defaults.FLEET_COMING_FOR) -> None:
        self.starts = starts
        self.coming_for = coming_for
        self._created: dict[str, float] = {}  # helper run id -> when the fleet created it
        self._arrived: set[str] = set()

    def created(self, run_id: str, now: float) -> None:
        """The fleet created helper ``run_id`` at ``now`` (its decision's time)."""
        self._created[run_id] = now

    def observe(self, now: float, holders: Iterable[Holder]) -> list[float]:
        """One frontier sample's holders: those holding leases have arrived; returns the starts
        measured in it (and adds them to ``starts``)."""
        measured = []
        for held in holders:
            if held.leased <= 0 or held.holder in self._arrived:
                continue
            self._arrived.add(held.holder)
            created = self._created.pop(held.holder, None)
            if created is not None:
                measured.append(now - created)
                self.starts.add(now - created)
        return measured

    def arrived(self, run_id: str) -> bool:
        """Whether ``run_id`` has held leases at least once."""
        return run_id in self._arrived

    def coming(self, processes: Iterable[tuple[str, float]]) -> int:
        """How many of ``processes`` (run id, seconds since it was created or due) have not
        claimed yet and are still expected to."""
        limit = self.coming_for * self.starts.expected_s
        return sum(1 for run_id, age in processes if run_id not in self._arrived and age <= limit)

    def keep(self, live: Collection[str]) -> None:
        """Forget the runs that ended (``live``: the run ids live now)."""
        self._arrived &= set(live)
        self._created = {k: v for k, v in self._created.items() if k in live}


class Reservations:
    """Slots soft preemption freed for a source, kept for it until it starts into them, no
    longer wants them, or ``keep_s`` passed (what :func:`plan_actions` takes as ``reserved``).

    A stop frees its slot only when the victim's run ended (a graceful stop finishes the
    requests in flight); by then the beneficiary's share may have moved, and without the
    reservation another source would start into the slot and be stopped again."""

    def __init__(self, keep_s: float = 15.0) -> None:
        self.keep_s = keep_s
        self._held: dict[str, tuple[int, float]] = {}  # source -> (slots, kept until)

    def freed(self, beneficiary: str, count: int, now: float) -> None:
        """``count`` helpers were stopped for ``beneficiary`` at ``now``."""
        held, _ = self._held.get(beneficiary, (0, now))
        self._held[beneficiary] = (held + count, now + self.keep_s)

    def started(self, source: str, count: int) -> None:
        """``source`` started ``count`` helpers: its reserved slots are used first."""
        held, until = self._held.get(source, (0, 0.0))
        if held - count > 0:
            self._held[source] = (held - count, until)
        else:
            self._held.pop(source, None)

    def now(self, now: float, wants: Mapping[str, int]) -> dict[str, int]:
        """The slots still held at ``now``; ``wants``: the helpers each source wants this round.
        A source that wants none (drained, scaled down) gives its slots up; one that wants no
        more than it has keeps them until ``keep_s`` (it asks one more at a time)."""
        self._held = {
            name: (held, until)
            for name, (held, until) in self._held.items()
            if until > now and wants.get(name, 0) > 0
        }
        return {name: held for name, (held, _) in self._held.items()}


@dataclass(frozen=True, slots=True)
class _Trial:
    """Helpers' arrivals being judged: did the claim rate rise with them? Arrivals less than
    ``gain_window_s`` apart are judged together, from the rate before the first to the rate
    after the last."""

    rate_before: float  # items/s over gain_window_s before the first one's first claim
    processes_before: float  # processes holding leases then (mean over the same window)
    helpers_before: int  # running helpers before the first one
    last: float  # the last one's first claim
    helpers_now: int  # running helpers with the last one
    claimed_at: int  # the source's claimed total at the last one's arrival


class SourceTracker:
    """One deployed source's running figures (one per source in the autoscaler)."""

    def __init__(
        self,
        source: str,
        run_class: str,
        *,
        max_helpers: int,
        settings: FleetSettings,
        rules: ScalingRules | None = None,
        window_s: float = 2.0,
        starts: HelperStarts | None = None,
        prior_throughput: float | None = None,
    ) -> None:
        self.source = source
        self.run_class = run_class
        self.max_helpers = max_helpers
        self.settings = settings
        self.window_s = window_s
        self.wait = ClaimWait(window_s=window_s, threshold_s=settings.wait_high_s)
        self.backlog = 0
        self._busy: deque[tuple[float, int, int]] = deque()  # (at, busy helpers, helpers)
        self._short_since: float | None = None
        self.rules = rules or ScalingRules()
        self._busy_high = Held()
        self._idle = Held()
        self._memory_high = Held()
        self._working: deque[tuple[float, int]] = deque()  # (at, processes holding leases)
        self._helper_count: int | None = None
        self.starts = starts  # the fleet's helper starts (None: instant, the 50 ms rule alone)
        # (at, claimed total, processes working it): the "no gain" rule's windows
        self._claims: deque[tuple[float, int, int]] = deque()
        self._trial: _Trial | None = None
        self._no_gain: tuple[float, int, str] | None = None  # (since, helpers before, why)
        # a forecast's throughput: the last one measured (across the source's runs), else this
        self.prior_throughput = prior_throughput
        self._known_throughput: float | None = None

    def sample(
        self, now: float, counts: StateCounts, holders: Iterable[Holder], helpers: Collection[str]
    ) -> None:
        """One frontier sample: counts, and who holds leases (``helpers``: the run ids of the
        helpers running: one still starting is neither busy nor idle)."""
        self.backlog = counts.queued
        self.wait.threshold_s = max(self.settings.wait_high_s, self.start_s())
        claimed = counts.leased + counts.done + counts.dead
        self.wait.observe(now, queued=counts.queued, claimed_total=claimed)
        holding = [h for h in holders if h.leased > 0]
        busy = sum(1 for h in holding if h.holder in helpers)
        self._busy.append((now, busy, len(helpers)))
        self._working.append((now, len(holding)))
        while self._busy and now - self._busy[0][0] > self.window_s:
            self._busy.popleft()
        while self._working and now - self._working[0][0] > self.window_s:
            self._working.popleft()
        if self._helper_count != len(helpers):
            self._helper_count = len(helpers)
            for window in (self._busy_high, self._idle, self._memory_high):
                window.reset()
        share = self.busy_share()
        self._busy_high.observe(now, share is not None and share > self.settings.busy_high)
        self._idle.observe(now, share is not None and share < self.rules.idle_below)
        # the processes working it: those holding leases and the running helpers (one
        # waiting for its host's slots or rate holds none and still counts)
        self._claims.append((now, claimed, len({h.holder for h in holding} | set(helpers))))
        while self._claims and now - self._claims[0][0] > self.settings.gain_window_s + 1.0:
            self._claims.popleft()
        self._judge(now, claimed, queued=counts.queued, helpers=len(helpers))

    @property
    def no_gain(self) -> str | None:
        """Why the source's step-ups are capped by the "no gain" rule now (None: they are not)."""
        return None if self._no_gain is None else self._no_gain[2]

    def helpers_arrived(self, now: float, helpers_now: int, count: int = 1) -> None:
        """``count`` helpers of this source claimed for the first time (``helpers_now``
        running with them): whether the claim rate rose with them is judged ``gain_window_s``
        later (with any that arrive meanwhile: the rule's trial)."""
        if count <= 0:
            return
        trial = self._trial
        claimed = self._claims[-1][1] if self._claims else 0
        now_at = self._claims[-1][0] if self._claims else now
        if trial is not None:
            self._trial = replace(trial, last=now_at, helpers_now=helpers_now, claimed_at=claimed)
            return
        window = self.settings.gain_window_s
        before = [x for x in self._claims if now - x[0] <= window and x[0] < now]
        began = next((i for i in range(1, len(before)) if before[i][1] > before[0][1]), None)
        if began is not None:  # the rate before is the work's since it began, not the idle
            before = before[began - 1 :]  # time ahead of it (helpers that came with the run)
        if len(before) < 2 or before[-1][0] - before[0][0] < window / 2:
            return  # too little seen before it to compare with
        (t0, c0, _), (t1, c1, _) = before[0], before[-1]
        self._trial = _Trial(
            rate_before=(c1 - c0) / (t1 - t0),
            processes_before=sum(x[2] for x in before[1:]) / (len(before) - 1),
            helpers_before=max(0, helpers_now - count),
            last=now_at,
            helpers_now=helpers_now,
            claimed_at=claimed,
        )

    def _judge(self, now: float, claimed: int, *, queued: int, helpers: int) -> None:
        """A trial whose window passed: no gain caps the step-ups (collector.fleet.model
        ``want``) at the helpers there were before it, for ``no_gain_keep_s``."""
        settings = self.settings
        if self._no_gain is not None and now - self._no_gain[0] >= settings.no_gain_keep_s:
            self._no_gain = None  # the host's limit may have changed: try again
        trial = self._trial
        if trial is None:
            return
        if queued <= 0 or helpers < trial.helpers_now:
            self._trial = None  # drained, or a helper left meanwhile: the rate says nothing
            return
        if now - trial.last < settings.gain_window_s:
            return
        self._trial = None
        after = (claimed - trial.claimed_at) / (now - trial.last)
        seen = [x[2] for x in self._claims if x[0] > trial.last]
        processes_after = sum(seen) / len(seen) if seen else 0.0
        added = trial.helpers_now - trial.helpers_before
        if gained(
            trial.rate_before, trial.processes_before, after, processes_after, added,
            settings.gain_min_share,
        ):  # fmt: skip
            self._no_gain = None
            return
        self._no_gain = (
            now,
            trial.helpers_before,
            f"helpers {trial.helpers_before + 1}-{trial.helpers_now} brought no gain "
            f"({trial.rate_before:.1f}/s before, {after:.1f}/s after)",
        )

    def start_s(self) -> float:
        """A new helper's expected start (0 without a start measure: instant)."""
        return 0.0 if self.starts is None else self.starts.expected_s

    def throughput(self) -> float | None:
        """Items/s one process claims: the claim rate over the mean count of processes holding
        leases in the window (None: nothing claimed, or no one held leases)."""
        working = sum(count for _, count in self._working) / max(1, len(self._working))
        if self.wait.rate <= 0 or working <= 0:
            return None
        return self.wait.rate / working

    def busy_share(self) -> float | None:
        """Share of helper-samples in which a helper held leases (None: no helper sampled)."""
        helper_samples = sum(count for _, _, count in self._busy)
        if helper_samples == 0:
            return None
        return sum(busy for _, busy, _ in self._busy) / helper_samples

    def load(
        self,
        now: float,
        helpers: int,
        stopping: int = 0,
        cpu: float | None = None,
        memory: float | None = None,
        coming: int = 0,
        forecast: int = 0,
    ) -> SourceLoad:
        """The source as :func:`collector.fleet.model.decide` takes it (``cpu``: the helpers'
        mean CPU share, ``memory`` their highest memory share, from their own reports:
        collector.fleet.report; ``coming``: its processes live but not claiming yet;
        ``forecast``: what its own run on the way is expected to plan, collector.fleet.forecast).

        A forecast stands for the backlog while it is larger and nothing claims (the run has
        not planned yet, and no process of the source held leases in the window: another run
        or helpers still working it are measured, not forecast): the claim wait is then unknown
        (infinite) and the throughput, not measured in this window, is the last one measured
        or the prior."""
        self._memory_high.observe(now, memory is not None and memory > self.rules.memory_high)
        backlog, wait_s, throughput = self.backlog, self.wait.estimate, self.throughput()
        if throughput is not None:
            self._known_throughput = throughput
        expected = 0
        working = any(count for _, count in self._working)  # someone held leases in the window
        if (
            forecast > 0
            and forecast >= backlog
            and not working
            and (backlog == 0 or math.isinf(wait_s))
        ):
            expected = backlog = forecast
            wait_s = math.inf
            throughput = self._known_throughput or self.prior_throughput
        return SourceLoad(
            source=self.source,
            run_class=self.run_class,
            backlog=backlog,
            wait_s=wait_s,
            wait_high_for_s=self.wait.high_for(now),
            busy=self.busy_share(),
            cpu=cpu,
            helpers=helpers,
            stopping=stopping,
            max_helpers=self.max_helpers,
            short_for_s=0.0 if self._short_since is None else now - self._short_since,
            busy_high_for_s=self._busy_high.held_for(now),
            idle_for_s=self._idle.held_for(now),
            memory=memory,
            memory_high_for_s=self._memory_high.held_for(now),
            throughput=throughput,
            rules=self.rules,
            start_s=self.start_s(),
            coming=coming,
            forecast=expected,
            no_gain_above=None if self._no_gain is None else self._no_gain[1],
            no_gain_why="" if self._no_gain is None else self._no_gain[2],
        )

    def decided(self, now: float, *, want: int, helpers: int) -> None:
        """After a decision: remember since when the source has had fewer helpers than it
        wanted (the shares give those short longest a helper first)."""
        if helpers < want:
            self._short_since = now if self._short_since is None else self._short_since
        else:
            self._short_since = None
