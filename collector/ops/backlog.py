"""Backlog watermark: how much of a source's work is outstanding, and when that becomes news.

``depth`` is what the frontier still owes: items ``queued`` + ``leased`` + ``expired`` (expired
items waited past their queue TTL and are queued again by the next plan, so they are owed too;
``done`` and ``dead`` are not). ``capacity`` is ``backlog.capacity`` from the source when set
(items the source's runs can work off between two monitor samples, the operator's number), or
else the number of items the frontier knows for the source, so the ratio is the share of the
source still outstanding.

The levels mean **overload**: work arriving faster than it is done. With ``backlog.capacity``
the ratio says so by itself (more is owed than the runs work off in one interval). Without it,
the ratio is only the share outstanding, which is 100 % at the start of every first run (the
plan queues the whole source at once): so then a level may rise only while the depth is not
shrinking, the newest depth being at or above the one ``backlog.trend_s`` earlier
(:func:`not_shrinking`). A run working its queue off stays ``ok`` however much is left; a
plan that adds more than the runs finish, or runs that finish nothing (a site that is down,
no worker), rise as before. Falling is never held back.

Levels move with hysteresis: a level is entered at its threshold and left only when the ratio
falls below a lower *clear* threshold, so a depth wobbling around 60 % raises one warning, not
one per sample. Only transitions are reported; the caller (the ``backlog-monitor`` flow) turns
them into events and keeps :class:`BacklogState` between runs. Plain Python: no Prefect here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collector import defaults
from collector.frontier.base import StateCounts

__all__ = [
    "BacklogSettings",
    "BacklogState",
    "Level",
    "Sample",
    "Thresholds",
    "Transition",
    "depth_of",
    "level_after",
    "next_level",
    "not_shrinking",
    "sample_of",
    "sparkline",
    "trend_markdown",
]

Level = Literal["ok", "warning", "critical"]
LEVELS: tuple[Level, ...] = ("ok", "warning", "critical")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Enter/clear ratios of the two levels; see :class:`BacklogSettings` for the rules."""

    warning: float = defaults.BACKLOG_WARNING
    warning_clear: float = defaults.BACKLOG_WARNING_CLEAR
    critical: float = defaults.BACKLOG_CRITICAL
    critical_clear: float = defaults.BACKLOG_CRITICAL_CLEAR

    def problems(self) -> list[str]:
        """Why these thresholds cannot give a hysteresis band (empty when they can)."""
        found = []
        if not 0 < self.warning_clear < self.warning:
            found.append("needs 0 < warning_clear < warning")
        if not self.warning < self.critical:
            found.append("needs warning < critical")
        if not self.warning_clear <= self.critical_clear < self.critical:
            found.append("needs warning_clear <= critical_clear < critical")
        return found


def next_level(current: Level, ratio: float, thresholds: Thresholds) -> Level:
    """The level after observing ``ratio`` while at ``current`` (the hysteresis rule).

    Rising, the highest threshold reached wins. Falling, a level is kept until the ratio goes
    below its clear threshold; critical falls to warning below ``critical_clear`` and straight
    to ok below ``warning_clear``.
    """
    t = thresholds
    if ratio >= t.critical:
        return "critical"
    if current == "critical":
        if ratio >= t.critical_clear:
            return "critical"
        return "warning" if ratio >= t.warning_clear else "ok"
    if ratio >= t.warning:
        return "warning"
    if current == "warning" and ratio >= t.warning_clear:
        return "warning"
    return "ok"


class BacklogSettings(BaseModel):
    """The ``backlog:`` section of a source (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity: int | None = Field(
        None,
        ge=1,
        description="Items the runs can work off between two monitor samples; default: every "
        "item the frontier knows for the source (ratio = share still outstanding).",
    )
    warning: float = Field(defaults.BACKLOG_WARNING, gt=0, description="Warning at this ratio.")
    warning_clear: float = Field(
        defaults.BACKLOG_WARNING_CLEAR, gt=0, description="Recovered below this ratio."
    )
    critical: float = Field(defaults.BACKLOG_CRITICAL, gt=0, description="Critical at this ratio.")
    critical_clear: float = Field(
        defaults.BACKLOG_CRITICAL_CLEAR, gt=0, description="Back to warning below this ratio."
    )
    trend_s: float = Field(
        defaults.BACKLOG_TREND_S,
        gt=0,
        description="Without capacity: how long the depth must not shrink before a level may "
        "rise (a queue being worked off is not overload).",
    )
    samples: int = Field(
        defaults.BACKLOG_SAMPLES,
        ge=2,
        le=defaults.BACKLOG_MAX_SAMPLES,
        description="Trend samples kept (shown in the backlog artifact).",
    )

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.warning, self.warning_clear, self.critical, self.critical_clear)

    @model_validator(mode="after")
    def _band(self) -> Self:
        problems = self.thresholds.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self


def depth_of(counts: StateCounts) -> int:
    """Outstanding items: queued + leased + expired (see the module docstring for why)."""
    return counts.queued + counts.leased + counts.expired


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a source's backlog."""

    at: float  # UNIX seconds
    depth: int
    capacity: int
    whole_source: bool = False  # capacity is the source's size (no backlog.capacity): a share

    @property
    def ratio(self) -> float:
        return self.depth / self.capacity if self.capacity > 0 else 0.0


def sample_of(counts: StateCounts, settings: BacklogSettings, *, now: float) -> Sample:
    """Depth and capacity of one source from its frontier counts."""
    if settings.capacity is not None:
        return Sample(at=now, depth=depth_of(counts), capacity=settings.capacity)
    return Sample(at=now, depth=depth_of(counts), capacity=counts.total, whole_source=True)


def not_shrinking(earlier: Sequence[Sample], sample: Sample, trend_s: float) -> bool:
    """Work arrives at least as fast as it is done: ``sample``'s depth is at or above the one of
    the newest earlier sample taken ``trend_s`` or more before it (False without one: no trend
    is known yet, e.g. the first samples of a run)."""
    before = next((s for s in reversed(earlier) if sample.at - s.at >= trend_s), None)
    return before is not None and sample.depth > 0 and sample.depth >= before.depth


def level_after(
    current: Level,
    earlier: Sequence[Sample],
    sample: Sample,
    thresholds: Thresholds,
    trend_s: float = defaults.BACKLOG_TREND_S,
) -> Level:
    """The level after ``sample``: :func:`next_level`, except that a share of the whole source
    (no ``backlog.capacity``) may not rise while the backlog shrinks (module docstring)."""
    level = next_level(current, sample.ratio, thresholds)
    rises = LEVELS.index(level) > LEVELS.index(current)
    if rises and sample.whole_source and not not_shrinking(earlier, sample, trend_s):
        return current
    return level


@dataclass(frozen=True, slots=True)
class Transition:
    """A level change: what the monitor reports as an event."""

    previous: Level
    level: Level
    sample: Sample

    @property
    def event(self) -> str:
        """``collector.backlog.warning|critical|recovered`` (recovered = back to ok)."""
        return "collector.backlog." + ("recovered" if self.level == "ok" else self.level)

    def payload(self, source: str) -> dict[str, Any]:
        return {
            "source": source,
            "depth": self.sample.depth,
            "capacity": self.sample.capacity,
            "ratio": round(self.sample.ratio, 4),
            "level": self.level,
            "previous_level": self.previous,
        }


@dataclass(slots=True)
class BacklogState:
    """What the monitor keeps between runs: the current level and the last samples."""

    level: Level = "ok"
    samples: list[Sample] = field(default_factory=list)

    def observe(
        self,
        sample: Sample,
        thresholds: Thresholds,
        *,
        keep: int,
        trend_s: float = defaults.BACKLOG_TREND_S,
    ) -> Transition | None:
        """Record ``sample``; return the transition it causes, if any."""
        previous = self.level
        self.level = level_after(previous, self.samples, sample, thresholds, trend_s)
        self.samples = [*self.samples, sample][-keep:]
        if self.level == previous:
            return None
        return Transition(previous, self.level, sample)

    def to_json(self) -> dict[str, Any]:
        """A compact JSON value (samples as ``[at, depth, capacity]``) for a Prefect Variable."""
        return {
            "level": self.level,
            "samples": [[round(s.at), s.depth, s.capacity] for s in self.samples],
        }

    @classmethod
    def from_json(cls, value: object) -> BacklogState:
        """Read what :meth:`to_json` wrote; anything else (missing, hand-edited) starts afresh."""
        if not isinstance(value, Mapping):
            return cls()
        level = value.get("level")
        samples: list[Sample] = []
        for row in value.get("samples") or []:
            if isinstance(row, Sequence) and len(row) == 3:
                try:
                    samples.append(Sample(float(row[0]), int(row[1]), int(row[2])))
                except (TypeError, ValueError):
                    continue
        return cls(level=level if level in LEVELS else "ok", samples=samples)


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(ratios: Sequence[float]) -> str:
    """One character per ratio, scaled so that a full bar is 100 % (or the peak, if above)."""
    if not ratios:
        return ""
    top = max(1.0, *ratios)
    steps = len(_BARS) - 1
    return "".join(_BARS[min(steps, max(0, math.floor(r / top * steps + 0.5)))] for r in ratios)


def trend_markdown(source: str, state: BacklogState, thresholds: Thresholds) -> str:
    """The trend artifact: level, sparkline, and a table of the kept samples (newest first)."""
    import datetime as dt

    lines = [
        f"# Backlog of `{source}`: {state.level}",
        "",
        f"`{sparkline([s.ratio for s in state.samples])}`  ratio over the last "
        f"{len(state.samples)} samples (warning at {thresholds.warning:.0%}, "
        f"critical at {thresholds.critical:.0%})",
        "",
        "| at (UTC) | depth | capacity | ratio |",
        "|---|---:|---:|---:|",
    ]
    for s in reversed(state.samples):
        at = dt.datetime.fromtimestamp(s.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"| {at} | {s.depth} | {s.capacity} | {s.ratio:.1%} |")
    return "\n".join(lines)
