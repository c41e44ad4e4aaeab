"""What the autoscaler keeps per source between decisions: claim wait, helpers' busy share,
how long the source has been short of helpers. Fed by frontier samples; Prefect-free.

The helpers report through the frontier itself: each helper claims under its own holder id
(its flow run id) and its leases show in :meth:`Frontier.holders`, so the busy share is the share
of samples in which a helper held leased items. A helper that waits for its frontier, for a
host's slots or for Prefect holds nothing and counts as idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable

from collector.fleet.model import ClaimWait, FleetSettings, SourceLoad
from collector.frontier.base import Holder, StateCounts

__all__ = ["SourceTracker"]


class SourceTracker:
    """One deployed source's running figures (one per source in the autoscaler)."""

    def __init__(
        self,
        source: str,
        run_class: str,
        *,
        max_helpers: int,
        settings: FleetSettings,
        window_s: float = 2.0,
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

    def sample(
        self, now: float, counts: StateCounts, holders: Iterable[Holder], helpers: Collection[str]
    ) -> None:
        """One frontier sample: counts, and who holds leases (``helpers``: helper run ids)."""
        self.backlog = counts.queued
        claimed = counts.leased + counts.done + counts.dead
        self.wait.observe(now, queued=counts.queued, claimed_total=claimed)
        busy = sum(1 for h in holders if h.leased > 0 and h.holder in helpers)
        self._busy.append((now, busy, len(helpers)))
        while self._busy and now - self._busy[0][0] > self.window_s:
            self._busy.popleft()

    def busy_share(self) -> float | None:
        """Share of helper-samples in which a helper held leases (None: no helper sampled)."""
        helper_samples = sum(count for _, _, count in self._busy)
        if helper_samples == 0:
            return None
        return sum(busy for _, busy, _ in self._busy) / helper_samples

    def load(
        self, now: float, helpers: int, stopping: int = 0, cpu: float | None = None
    ) -> SourceLoad:
        """The source as :func:`collector.fleet.model.decide` takes it (``cpu``: the helpers'
        mean CPU share, from their own reports: collector.fleet.report)."""
        return SourceLoad(
            source=self.source,
            run_class=self.run_class,
            backlog=self.backlog,
            wait_s=self.wait.estimate,
            wait_high_for_s=self.wait.high_for(now),
            busy=self.busy_share(),
            cpu=cpu,
            helpers=helpers,
            stopping=stopping,
            max_helpers=self.max_helpers,
            short_for_s=0.0 if self._short_since is None else now - self._short_since,
        )

    def decided(self, now: float, *, want: int, helpers: int) -> None:
        """After a decision: remember since when the source has had fewer helpers than it
        wanted (the shares give those short longest a helper first)."""
        if helpers < want:
            self._short_since = now if self._short_since is None else self._short_since
        else:
            self._short_since = None
