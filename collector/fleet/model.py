"""How many ``collector work`` helpers each deployed source gets: the autoscaler's decisions,
as pure functions of samples, so they are tested in virtual time.

The model (docs/fleet.md):

- **load factor** of a source: ``log2(1 + backlog / backlog_unit) + log10(1 + wait / wait_high)``,
  capped at ``load_cap``, and 0 when nothing is due. ``backlog`` is the due items (queued),
  ``wait`` the claim wait (how long a due item waits before a claim: :class:`ClaimWait`).
- **weight** = class priority (critical 4, high 3, normal 2, low 1) x (1 + load factor).
- **want** (:func:`want`, the seeds' rules, each held for its window before it acts): 0 when the
  source drained (nothing due). Down one step (``floor(helpers / 1.2)``) when the helpers'
  memory share stayed above ``memory_high`` for ``memory_held_s``, or their busy share stayed
  below ``idle_below`` for ``idle_held_s``. Otherwise up to the largest of: the pool size
  ``ceil(backlog x 0.8 / (throughput x size_horizon_s))`` (throughput: items/s one process
  claims), ``ceil(helpers x 1.2)`` (at least one more) when busy stayed above ``busy_high`` for
  ``busy_held_s``, one more when the claim wait stayed above ``wait_high_s`` for
  ``wait_held_s`` or the helpers' CPU is above ``cpu_high``; never up while memory is above
  ``memory_high`` or the helpers are idle (more of them would not claim more: the limit is
  elsewhere, a host's slots or rate). Never below ``min_helpers`` while items are due, never
  above its cap: ``schedule.max_helpers``, and 0 when more helpers would break per-host
  politeness (:func:`politeness_cap`).
- **arrival** (a helper is a process start: :class:`HelperStarts` measures it): a step up is
  granted only when the backlog outlasts a new helper's start and ``arrival_work`` starts of
  work after it, at the rate it is drained now with the processes on their way counted
  (:func:`arrives_in_time`: the helper arrives before the work is gone, and claims long
  enough to pay for its start's CPU); the claim-wait
  rule's threshold is ``max(wait_high_s, expected start)`` (the 50 ms rule when starts are
  instant), the pool size counts the backlog left when a new helper arrives
  (:func:`left_at_arrival`), and "nothing claims" asks for none while a process of the source
  is on its way (created, pending or starting: it arrives sooner than a new one would).
- **forecast** (collector.fleet.forecast): while a source's own run is on its way and nothing
  of it claims, its backlog is what that run is expected to plan (the frontier's due count, and
  the seeds it does not hold yet), its claim wait unknown, and the pool size reads the
  throughput one of its processes had the last time it was measured (else a prior from its
  request slots): its helpers are asked for with its run, not a plan and a start after it,
  into free slots only. No helper is preempted for a forecast: a stop is made for a need
  measured, when the other sources' drains are known too (a critical source requested while
  none was known yet took a `bulk-low` helper that had not claimed, the fleet's long pole,
  in the `capped` play of 2026-12-06 21:12).
- **no gain**: when a helper's arrival (its first claim) did not raise the source's claim rate
  by half of one process's rate (:func:`gained`, over ``gain_window_s`` before and after), the
  step-up rules ask for no more helpers than the source had before it, for ``no_gain_keep_s``,
  across a step down: a source bound by its host's rate does not re-add a helper that did not
  help about once a minute (its claim wait outlasts any start).
- **shares** of the global ``budget``: first one helper each to the sources that want one
  (those starved longest first, then by weight), then the rest one at a time to the source with
  the highest ``weight / (helpers given + 1)``, never above its want.
- **actions** (:func:`plan_actions`): start helpers only into free budget (stopping helpers count
  as running until they end, so the budget is never exceeded); a source scaled down (idle,
  memory) has its surplus stopped gracefully; a drained source's helpers are not stopped: they
  end by themselves once nothing is due (stopping them would cut requests in flight); and
  *soft preemption*: when the budget is full and a source of a higher class is
  short, stop one helper of a lower class that holds more than its share (the graceful stop:
  its items go back unchanged, no attempt counted), the one whose stop delays the fleet's last
  drain least (:func:`victims`: off the critical path first, never the source that decides
  "all drained" while another may go, then the lowest weight).

Plain Python; the flow (flows/fleet.py) samples the frontiers and carries out the actions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Literal

from collector import defaults

__all__ = [
    "CLASS_PRIORITY",
    "Actions",
    "ClaimWait",
    "Decision",
    "FleetSettings",
    "Held",
    "HelperStarts",
    "ScalingRules",
    "SourceLoad",
    "Victim",
    "arrives_in_time",
    "decide",
    "drain_s",
    "drain_with_one_more_s",
    "drain_without_one_s",
    "gained",
    "helper_gain_s",
    "left_at_arrival",
    "load_factor",
    "plan_actions",
    "politeness_cap",
    "pool_size",
    "shares",
    "step_down",
    "step_up",
    "victims",
    "want",
    "weight",
]

RunClass = Literal["critical", "high", "normal", "low"]
CLASS_PRIORITY: Mapping[str, int] = {"critical": 4, "high": 3, "normal": 2, "low": 1}
"""A class's priority in the weight (the pool's queue priorities 1..4, turned around)."""


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """The autoscaler's knobs (defaults in collector/defaults.py, docs/fleet.md)."""

    budget: int = defaults.FLEET_BUDGET
    wait_high_s: float = defaults.FLEET_WAIT_HIGH_S
    wait_held_s: float = defaults.FLEET_WAIT_HELD_S
    busy_high: float = defaults.FLEET_BUSY_HIGH
    cpu_high: float = defaults.FLEET_CPU_HIGH
    load_cap: float = defaults.FLEET_LOAD_CAP
    backlog_unit: int = defaults.FLEET_BACKLOG_UNIT
    starve_after_s: float = 30.0  # a source short of helpers this long goes first for one
    preempt: bool = True
    # "no gain": a helper whose arrival did not raise its source's claim rate by at least this
    # share of one process's rate, judged over gain_window_s before and after its first claim,
    # caps the source's step-ups at the helpers it had before, for no_gain_keep_s
    gain_min_share: float = 0.5
    gain_window_s: float = 10.0
    no_gain_keep_s: float = 300.0
    # a step up only when the helper would claim at least this many of its starts' time after
    # it arrives (arrives_in_time); 0: whenever work is left at its arrival
    arrival_work: float = defaults.FLEET_ARRIVAL_WORK


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One source's scaling rules (its ``schedule:`` section; defaults: collector/defaults.py)."""

    min_helpers: int = defaults.FLEET_MIN_HELPERS
    scale_factor: float = defaults.FLEET_SCALE_FACTOR
    depth_share: float = defaults.FLEET_DEPTH_SHARE
    size_horizon_s: float = defaults.FLEET_SIZE_HORIZON_S
    busy_held_s: float = defaults.FLEET_BUSY_HELD_S
    idle_below: float = defaults.FLEET_IDLE_BELOW
    idle_held_s: float = defaults.FLEET_IDLE_HELD_S
    memory_high: float = defaults.FLEET_MEMORY_HIGH
    memory_held_s: float = defaults.FLEET_MEMORY_HELD_S


@dataclass(frozen=True, slots=True)
class SourceLoad:
    """One deployed source as the autoscaler sees it at one moment."""

    source: str
    run_class: str
    backlog: int  # due items: queued
    wait_s: float  # claim wait (ClaimWait.estimate); math.inf: due items and nothing claims
    wait_high_for_s: float = 0.0  # how long wait_s has stayed above wait_high_s
    busy: float | None = None  # helpers' busy share, when they report it
    cpu: float | None = None  # helpers' mean CPU share (their own reports; 1.0: one core)
    helpers: int = 0  # helper runs going now (stopping ones included)
    stopping: int = 0  # of which asked to stop already (their slots free once they ended)
    max_helpers: int = defaults.FLEET_MAX_HELPERS  # schedule.max_helpers and politeness
    short_for_s: float = 0.0  # how long it has had fewer helpers than it wanted
    busy_high_for_s: float = 0.0  # how long busy has stayed above busy_high (this helper count)
    idle_for_s: float = 0.0  # how long busy has stayed below rules.idle_below (this count)
    memory: float | None = None  # the highest memory share its helpers report (1.0: all)
    memory_high_for_s: float = 0.0  # how long memory has stayed above rules.memory_high
    throughput: float | None = None  # items/s one process claims (None: not measured yet)
    rules: ScalingRules = ScalingRules()
    start_s: float = 0.0  # a new helper's expected start, creation to first claim (0: instant)
    coming: int = 0  # its processes live but not claiming yet (helpers starting, its own run)
    forecast: int = 0  # backlog is what its run on the way is expected to plan (0: measured)
    no_gain_above: int | None = None  # the last helper brought no gain: at most this many more
    no_gain_why: str = ""  # the rates that showed it


@dataclass(frozen=True, slots=True)
class Decision:
    """What the autoscaler decided for one source, with the figures that caused it."""

    load: SourceLoad
    load_factor: float
    weight: float
    want: int
    share: int
    why: str
    scale_down: bool = False  # want is below helpers by a rule (idle, memory): stop the surplus


@dataclass(frozen=True, slots=True)
class Actions:
    """Helpers to start and to stop per source in this round (stops: graceful)."""

    start: dict[str, int] = field(default_factory=dict)
    stop: dict[str, int] = field(default_factory=dict)
    preempted: dict[str, str] = field(default_factory=dict)  # victim -> the source it frees for
    victim_why: dict[str, str] = field(default_factory=dict)  # victim -> why it was chosen


def load_factor(backlog: int, wait_s: float, settings: FleetSettings) -> float:
    """How loaded a source is, 0 (nothing due) .. ``load_cap``; grows with backlog and wait."""
    if backlog <= 0:
        return 0.0
    if math.isinf(wait_s):
        return settings.load_cap
    factor = math.log2(1 + backlog / settings.backlog_unit) + math.log10(
        1 + max(0.0, wait_s) / settings.wait_high_s
    )
    return min(settings.load_cap, factor)


def weight(run_class: str, factor: float) -> float:
    """``class priority x (1 + load factor)``."""
    return CLASS_PRIORITY[run_class] * (1.0 + factor)


def politeness_cap(
    *, shared_domain_concurrency: bool, per_domain_rate: str | None, rate_storage: str
) -> tuple[int | None, str]:
    """Most helpers per-host politeness allows a source (None: no limit from it), and why.

    A helper is another process: unless the per-host limits are shared by all of them (the
    ``domain:<host>`` slots of ``limits.shared_domain_concurrency``, and a per-host rate counted
    in Redis), each helper would add its own window and rate to every host. Then it gets none.
    """
    if not shared_domain_concurrency:
        return 0, "per-host concurrency is per process: set limits.shared_domain_concurrency"
    if per_domain_rate is not None and rate_storage.startswith("memory"):
        return 0, "per-host rate is per process: set limits.rate_storage to a redis:// URL"
    return None, "helpers share the per-host slots and rate"


def step_up(helpers: int, factor: float) -> int:
    """``ceil(helpers x factor)``, at least one more (10 -> 12 at 1.2; 0 -> 1)."""
    return max(helpers + 1, math.ceil(round(helpers * factor, 9)))


def step_down(helpers: int, factor: float) -> int:
    """``floor(helpers / factor)``, at least one fewer, never below 0 (10 -> 8 at 1.2)."""
    return max(0, min(helpers - 1, math.floor(round(helpers / factor, 9))))


def pool_size(backlog: float, throughput: float | None, rules: ScalingRules) -> int | None:
    """Helpers by the seeds' ``targetSize = max(minSize, ceil(depth x 0.8 / throughput))``:
    throughput is what one process claims in ``size_horizon_s``, and the source's own run is
    one process of the pool, so helpers = targetSize - 1 (None: no throughput measured yet)."""
    if throughput is None or throughput <= 0 or math.isinf(throughput):
        return None
    per_process = throughput * rules.size_horizon_s
    processes = math.ceil(round(backlog * rules.depth_share / per_process, 9))
    return max(rules.min_helpers, processes - 1)


def left_at_arrival(backlog: float, wait_s: float, start_s: float) -> float:
    """The backlog left when a helper asked for now arrives: the claim rate now is
    ``backlog / wait_s`` (Little's law), so ``start_s`` later ``backlog x (1 - start / wait)``
    is left (all of it when nothing claims or starts are instant; none when it drains first)."""
    if backlog <= 0:
        return 0.0
    if start_s <= 0 or math.isinf(wait_s):
        return float(backlog)
    if wait_s <= start_s:
        return 0.0
    return backlog * (wait_s - start_s) / wait_s


def arrives_in_time(load: SourceLoad, arrival_work: float) -> bool:
    """Whether a helper asked for now still finds work when it arrives, and enough of it: the
    source's drain, at the claim rate now plus one process's throughput for each process
    already on its way (``coming``: they arrive before this one would), outlasts the helper's
    start by ``arrival_work`` starts. A start is a process start (CPU the other processes on
    the box lose): a helper that claims for less than its start took about as much as it gave.
    Always when starts are instant or nothing claims yet (the drain is not known)."""
    if load.start_s <= 0 or math.isinf(load.wait_s):
        return True
    if load.wait_s <= 0:
        return False
    start = Fraction(load.start_s)
    return drain_s(load) > start + Fraction(arrival_work) * start


def want(load: SourceLoad, settings: FleetSettings) -> tuple[int, str, bool]:
    """How many helpers the source asks for now, why, and whether it is a scale-down.

    Every step up waits for a helper's arrival: it is granted only when the backlog outlasts a
    new helper's start (``load.start_s``) at the rate it is drained now, because a helper
    that arrives after the work is gone spends budget (and a process start's CPU) for nothing.
    """
    cap = max(0, load.max_helpers)
    rules = load.rules
    have = load.helpers
    if load.backlog <= 0:
        return 0, "drained", False
    if cap == 0:
        return 0, "no helpers allowed (max_helpers or politeness)", False
    floor = min(cap, rules.min_helpers)
    memory_high = load.memory is not None and load.memory > rules.memory_high
    if memory_high and have > floor and load.memory_high_for_s >= rules.memory_held_s:
        return (
            min(cap, max(floor, step_down(have, rules.scale_factor))),
            (
                f"helpers' memory {load.memory:.0%} > {rules.memory_high:.0%} "
                f"for {load.memory_high_for_s:.0f} s"
            ),
            True,
        )
    idle = load.busy is not None and load.busy < rules.idle_below
    if idle and have > floor and load.idle_for_s >= rules.idle_held_s:
        return (
            min(cap, max(floor, step_down(have, rules.scale_factor))),
            (
                f"helpers idle: busy {load.busy:.0%} < {rules.idle_below:.0%} "
                f"for {load.idle_for_s:.0f} s"
            ),
            True,
        )
    if memory_high:
        return min(cap, max(floor, have)), f"helpers' memory {load.memory:.0%}: no step up", False
    if idle:  # helpers that hold no work while items are due: the limit is elsewhere
        return min(cap, max(floor, have)), f"helpers idle (busy {load.busy:.0%}): no step up", False
    # the helper asked for now arrives start_s from now: worth it only if work is left then,
    # enough to pay for its start (settings.arrival_work starts' time), with the processes
    # already on their way claiming too
    drain = drain_s(load)
    outlasts = arrives_in_time(load, settings.arrival_work)
    steady = "steady"
    if not outlasts:
        shown = float(drain) if load.wait_s > 0 else 0.0  # no claim rate measured yet
        steady = (f"drains in {_seconds(shown)}, before a helper's start "
                  f"({_seconds(load.start_s)}) and {settings.arrival_work:g} x its start's "
                  f"work")  # fmt: skip
    asks: list[tuple[int, str]] = [(have, steady)]
    if have < floor:
        asks.append((floor, f"min_helpers {rules.min_helpers}"))
    left = left_at_arrival(load.backlog, float(drain), load.start_s)
    size = pool_size(left, load.throughput, rules) if outlasts else None
    if size is not None:
        due = "expected once its run planned" if load.forecast else "due at arrival"
        asks.append((size, f"pool size: {left:.0f} {due} x {rules.depth_share:g} / "
                           f"({load.throughput:.1f}/s x {rules.size_horizon_s:g} s)"))  # fmt: skip
    threshold = max(settings.wait_high_s, load.start_s)
    if load.wait_high_for_s >= settings.wait_held_s and load.wait_s > threshold and outlasts:
        if math.isinf(load.wait_s) and load.coming > 0:  # one on its way arrives first
            asks[0] = (have, f"nothing claims yet: {load.coming} process(es) on the way")
        else:
            asks.append((have + 1, f"claim wait {_seconds(load.wait_s)} > "
                                   f"{_seconds(threshold)} for "
                                   f"{load.wait_high_for_s:.1f} s"))  # fmt: skip
    if (
        outlasts
        and load.busy is not None
        and load.busy > settings.busy_high
        and have > 0
        and load.busy_high_for_s >= rules.busy_held_s
    ):
        asks.append((step_up(have, rules.scale_factor),
                     f"helpers busy {load.busy:.0%} for {load.busy_high_for_s:.0f} s"))  # fmt: skip
    if outlasts and load.cpu is not None and load.cpu > settings.cpu_high and have > 0:
        asks.append((have + 1, f"helpers' CPU {load.cpu:.0%} > {settings.cpu_high:.0%} of a core"))
    count, why = max(asks, key=lambda a: a[0])  # the first of the largest: steady before a rule
    if load.no_gain_above is not None:  # a helper that did not help: no step up past it
        most = max(have, floor, load.no_gain_above)
        if count > most:
            count, why = most, f"no step up: {load.no_gain_why}"
    return min(cap, count), why, False


def gained(
    rate_before: float,
    processes_before: float,
    rate_after: float,
    processes_after: float,
    added: int,
    min_share: float,
) -> bool:
    """Whether ``added`` processes raised the claim rate: after them it is at least what the
    processes there before claim at the rate each claimed before (``rate_before /
    processes_before``; processes: the mean count holding leases over each window) plus
    ``min_share`` of that for each one added. A source bound by its host's rate, or a box
    with no CPU left, claims no faster with them: each process then claims less. Nothing
    claimed before: any rise is a gain."""
    if processes_before <= 0 or rate_before <= 0:
        return rate_after > rate_before
    per_process = Fraction(rate_before) / Fraction(processes_before)  # exact: no edge rounding
    kept = Fraction(processes_after) - added * (1 - Fraction(min_share))
    return Fraction(rate_after) >= per_process * kept


def shares(
    wants: Mapping[str, int],
    weights: Mapping[str, float],
    short_for_s: Mapping[str, float],
    settings: FleetSettings,
) -> dict[str, int]:
    """Split ``budget`` helpers among the sources by weight, none above its want."""
    given = {name: 0 for name in wants}
    left = max(0, settings.budget)
    wanting = [name for name, count in wants.items() if count > 0]
    starved = [n for n in wanting if short_for_s.get(n, 0.0) >= settings.starve_after_s]
    first = sorted(starved, key=lambda n: (-short_for_s[n], -weights[n], n)) + sorted(
        (n for n in wanting if n not in starved), key=lambda n: (-weights[n], n)
    )
    for name in first:  # one each first: a source that wants a helper is not starved
        if left == 0:
            break
        given[name] = 1
        left -= 1
    while left > 0:
        open_ = [n for n in wanting if given[n] < wants[n]]
        if not open_:
            break
        best = max(open_, key=lambda n: (weights[n] / (given[n] + 1), -given[n], n))
        given[best] += 1
        left -= 1
    return given


def decide(loads: Sequence[SourceLoad], settings: FleetSettings) -> list[Decision]:
    """Each source's load factor, weight, want and share of the budget."""
    factors = {x.source: load_factor(x.backlog, x.wait_s, settings) for x in loads}
    weights = {x.source: weight(x.run_class, factors[x.source]) for x in loads}
    asked = {x.source: want(x, settings) for x in loads}
    given = shares(
        {name: count for name, (count, _, _) in asked.items()},
        weights,
        {x.source: x.short_for_s for x in loads},
        settings,
    )
    return [
        Decision(
            load=x,
            load_factor=factors[x.source],
            weight=weights[x.source],
            want=asked[x.source][0],
            share=given[x.source],
            why=asked[x.source][1],
            scale_down=asked[x.source][2],
        )
        for x in loads
    ]


def _rate(load: SourceLoad, starting: int = 0) -> Fraction | None:
    """Items/s the source will claim once its processes on the way arrive: the claim rate now
    (backlog / claim wait) plus one process's throughput for each coming or starting (None:
    not known, nothing claims)."""
    if math.isinf(load.wait_s) or load.wait_s <= 0:
        return None
    rate = Fraction(load.backlog) / Fraction(load.wait_s)
    if load.throughput is not None and math.isfinite(load.throughput):
        rate += (load.coming + starting) * Fraction(load.throughput)
    return rate


def drain_s(load: SourceLoad, starting: int = 0) -> Fraction | float:
    """How long the source's backlog lasts: its backlog over the claim rate now with its
    processes on the way counted (``coming``, and ``starting`` this round), exact (a Fraction
    of the floats). 0 when drained; ``math.inf`` when not known (nothing claims yet)."""
    if load.backlog <= 0:
        return Fraction(0)
    rate = _rate(load, starting)
    return math.inf if rate is None else Fraction(load.backlog) / rate


def drain_without_one_s(load: SourceLoad, starting: int = 0) -> Fraction | float:
    """The source's drain once one of its processes stops: its backlog over that rate less
    one process's throughput. ``math.inf`` when not known (no throughput measured, nothing
    claims) or when no process would be left. A helper given back later only shortens it, so
    it bounds the cost of a stop and a second start."""
    if load.backlog <= 0:
        return Fraction(0)
    rate = _rate(load, starting)
    if rate is None or load.throughput is None or not math.isfinite(load.throughput):
        return math.inf
    left = rate - Fraction(load.throughput)
    return Fraction(load.backlog) / left if left > 0 else math.inf


def drain_with_one_more_s(load: SourceLoad, starting: int = 0) -> Fraction | float:
    """The source's drain once one more helper, asked for now, arrives ``start_s`` from now and
    claims at one process's throughput: what a preemption for it buys. The same as
    :func:`drain_s` when no throughput is measured or the source drains before it arrives."""
    rate = _rate(load, starting)
    now = drain_s(load, starting)
    if rate is None or load.throughput is None or not math.isfinite(load.throughput):
        return now
    start = Fraction(max(0.0, load.start_s))
    left = Fraction(load.backlog) - rate * start
    if left <= 0:
        return now
    return start + left / (rate + Fraction(load.throughput))


def helper_gain_s(load: SourceLoad, starting: int = 0) -> Fraction | float:
    """How much sooner the source drains once one more helper, asked for now, has arrived
    (:func:`drain_with_one_more_s`): what a stop made for it buys. 0 when it drains before the
    helper would arrive, or nothing of it claims yet but a process is on its way (its drain is
    about to be known); ``math.inf`` when nothing claims and none is on its way (its items wait
    for a helper: without one they never drain)."""
    now = drain_s(load, starting)
    if math.isinf(now):
        return Fraction(0) if load.coming + starting > 0 else math.inf
    return max(Fraction(0), Fraction(now) - Fraction(drain_with_one_more_s(load, starting)))


def _longest(
    decisions: Sequence[Decision], starting: Mapping[str, int], *leave_out: str
) -> Fraction:
    """The longest known drain of the sources other than ``leave_out`` (0: none known). A
    source whose drain is not known (nothing claims yet) is left out: it says nothing of when
    the fleet ends."""
    known = [drain_s(d.load, starting.get(d.load.source, 0))
             for d in decisions if d.load.source not in leave_out]  # fmt: skip
    return max((Fraction(x) for x in known if not math.isinf(x)), default=Fraction(0))


@dataclass(frozen=True, slots=True)
class Victim:
    """A helper that may be stopped for a beneficiary, and what the stop costs the fleet."""

    decision: Decision
    delay: Fraction | float  # how much later the fleet's last drain ends (0: off the path)
    decides: bool  # its drain is the longest: it decides "all drained" now
    why: str


def victims(
    decisions: Sequence[Decision],
    beneficiary: Decision,
    taken: Collection[str] = (),
    starting: Mapping[str, int] | None = None,
) -> list[Victim]:
    """The helpers that may be preempted for ``beneficiary``, the preferred first.

    A stop costs the victim one process until a helper comes back (its drain after the stop,
    :func:`drain_without_one_s`, bounds it, a second start included); what it costs the fleet
    is the *delay*: how much later than now the fleet's last drain ends (the beneficiary left
    out: its wait is about to shorten; every drain counts the processes on their way, the
    helpers ``starting`` this round included). Off the critical path (the victim still drains before
    the longest other) the delay is 0. Who may be stopped: a lower-class source with a helper
    running (not stopping, none taken this round: ``taken``) that holds more than its share,
    as before; or, in its place, one at its share whose stop delays the end less (the same one
    stop, where it costs less; also where the stop above a share is refused for what it
    costs). The order: never the source that decides "all drained" while
    another of a lower or equal class may go, then the least delay, then the lowest weight.
    A source of a higher class than the beneficiary's that may still grow (below its
    ``max_helpers``) is left out of both ends: it will take its helpers from the classes below
    by preemption first, so its drain as it is now (a critical source just requested, its own
    run claiming alone: minutes) says nothing of the fleet's end; counted, it made a `bulk-low`
    stop for `burst` look off the critical path, and `urgent` then took that helper from
    `burst` (the `open` play of 2026-12-06 08:51: a start and a stop for nothing).
    A stop that delays the end past the beneficiary's own drain *once the helper it is given
    has arrived* (:func:`drain_with_one_more_s`) would move the fleet's end later for a source
    that does not decide it (one whose drain is not known yet, nothing of it claiming, allows
    none: it may be short). Judged on the beneficiary's drain before its helper, a source that
    had just lost a helper to a critical one took one from a lower class on the fleet's
    critical path in turn (the `capped` play of 2026-12-06 08:19: two stops and two starts
    where one of each was needed). A critical source may move the end later too, by no more
    than the helper saves it (:func:`helper_gain_s`): the operator's latency first, but not
    at any price. Allowed any stop, `urgent` took `burst`'s second helper, on the path, for
    ~4 s sooner, and `burst`, capped at two and left with its own run, ended the fleet ~20 s
    later (the `capped` play with preemption, 0.91-0.95 x the fixed split in runs 10 and 11 of
    2026-12-06).
    """
    starting = starting or {}
    mine = beneficiary.load.source
    rank = CLASS_PRIORITY[beneficiary.load.run_class]
    # a source of a higher class that may still grow takes its helpers from the classes below
    # (by preemption, first): its drain now says nothing of when the fleet ends
    growing = [
        d.load.source
        for d in decisions
        if CLASS_PRIORITY[d.load.run_class] > rank
        and d.load.backlog > 0
        and d.load.helpers < d.load.max_helpers
    ]
    now_end = _longest(decisions, starting, mine, *growing)
    # the beneficiary's own drain once the helper it is given arrives: a stop that moves the
    # fleet's end past it trades a working helper for a later end
    own = drain_with_one_more_s(beneficiary.load, starting.get(mine, 0))
    own = Fraction(0) if math.isinf(own) else own  # not known yet: it allows no delay
    ceiling: Fraction | float = max(now_end, own)
    if beneficiary.load.run_class == "critical":
        # the operator's latency first, but not at any price: the fleet's end may move later
        # by as much as the helper saves the critical source, no more
        ceiling = max(ceiling, now_end + helper_gain_s(beneficiary.load, starting.get(mine, 0)))
    over: list[Victim] = []
    at_share: list[Victim] = []
    least: Fraction | float | None = None  # the least delay of a stop above a share
    for v in decisions:
        load = v.load
        name = load.source
        running = load.helpers - load.stopping
        if (
            name in taken
            or running <= 0
            or CLASS_PRIORITY[load.run_class] >= CLASS_PRIORITY[beneficiary.load.run_class]
        ):
            continue
        others = _longest(decisions, starting, name, mine, *growing)
        after = drain_without_one_s(load, starting.get(name, 0))
        end = max(after, others)
        delay = end - now_end
        if running > v.share:  # refused or not, it is the stop an at-share one replaces
            least = delay if least is None else min(least, delay)
        if end > ceiling:
            continue  # it would move the end past the beneficiary's own (or its gain)
        now = drain_s(load, starting.get(name, 0))
        decides = math.isinf(now) or Fraction(now) >= others
        where = "on" if delay > 0 else "off"
        why = (f"{where} the critical path: drains in {_seconds(float(after))} without it, "
               f"the longest other {_seconds(float(others))}")  # fmt: skip
        (over if running > v.share else at_share).append(Victim(v, delay, decides, why))
    found = over + [x for x in at_share if least is not None and x.delay < least]

    def order(x: Victim) -> tuple[bool, Fraction | float, float, str]:
        rank = CLASS_PRIORITY[x.decision.load.run_class]
        spared = x.decides and any(
            y is not x and CLASS_PRIORITY[y.decision.load.run_class] <= rank for y in found
        )
        return spared, x.delay, x.decision.weight, x.decision.load.source

    return sorted(found, key=order)


def plan_actions(
    decisions: Sequence[Decision],
    settings: FleetSettings,
    reserved: Mapping[str, int] | None = None,
) -> Actions:
    """Starts, stops and preemptions that move the running helpers towards the shares.

    ``reserved``: slots a preemption freed for a source (its victim's stop ended or is
    ending) that it has not started into yet. Free slots go to those first, up to what the
    source wants now, whatever its share is this round, and the rest of its reserved slots
    stay free (no other source starts into them) while the reservation lasts
    (:class:`~collector.fleet.tracker.Reservations`): wants and shares move with every sample
    (a critical source asks one more helper at a time), and the slot a stop freed for it
    would otherwise go to a source the next round stops again (the `open` play of 2026-12-06
    08:25: a `burst` helper started into `urgent`'s slot and was preempted for `urgent` 0.7 s
    later: a stop and a start for nothing)."""
    running = {d.load.source: d.load.helpers for d in decisions}
    free = max(0, settings.budget - sum(running.values()))
    start: dict[str, int] = {}
    stop: dict[str, int] = {}
    preempted: dict[str, str] = {}
    why: dict[str, str] = {}
    by_class = sorted(
        decisions, key=lambda d: (-CLASS_PRIORITY[d.load.run_class], -d.weight, d.load.source)
    )
    for d in by_class:
        held = (reserved or {}).get(d.load.source, 0)
        count = min(held, max(0, d.want - d.load.helpers), free)
        if count > 0:
            start[d.load.source] = count
        free -= min(held, free)  # used now, or kept free for it
    short = [d for d in by_class if d.share > d.load.helpers]
    for d in short:
        count = min(d.share - d.load.helpers - start.get(d.load.source, 0), free)
        if count > 0:
            start[d.load.source] = start.get(d.load.source, 0) + count
            free -= count
    for d in decisions:  # scaled down by a rule: the surplus stops gracefully
        surplus = d.load.helpers - d.load.stopping - d.want
        if d.scale_down and surplus > 0:
            stop[d.load.source] = surplus
    freeing = sum(d.load.stopping for d in decisions)  # slots already on their way back
    if settings.preempt and free == 0:
        for d in short:
            missing = d.share - d.load.helpers - start.get(d.load.source, 0)
            if missing <= 0:
                continue
            if d.load.forecast:  # its need is a forecast: it starts into free slots only
                continue
            if freeing > 0:  # a helper stopping already frees a slot: wait for it
                freeing -= 1
                continue
            # a source scaled down this round is not preempted too; one victim per source
            found = victims(decisions, d, taken={*stop, *preempted}, starting=start)
            if not found:
                continue
            victim = found[0].decision.load.source
            stop[victim] = stop.get(victim, 0) + 1
            preempted[victim] = d.load.source
            why[victim] = found[0].why
    return Actions(start, stop, preempted, why)


class ClaimWait:
    """A source's claim wait from frontier samples, and how long it stayed high.

    The wait a due item has before a claim is estimated by Little's law: ``queued / claim
    rate``, the claim rate being the growth of ``leased + done + dead`` over the last
    ``window_s`` of samples (taken every ``FLEET_SAMPLE_S``, 100 ms). Nothing queued: 0. Items
    queued and none claimed over the window: infinite (no one is working the source).

    When claims begin after none (a run or helper arrived), the rate counts from the last
    sample without claims, not over the idle time before it: over that, a process's first
    batches would look like a long wait, and a source that its own run drains in seconds
    would ask for a helper that arrives after it drained.
    ``threshold_s`` may be changed between samples (the fleet sets it to the larger of its
    ``wait_high_s`` and a helper's expected start).
    """

    def __init__(self, window_s: float = 2.0, threshold_s: float = defaults.FLEET_WAIT_HIGH_S):
        self.window_s = window_s
        self.threshold_s = threshold_s
        self._samples: deque[tuple[float, int]] = deque()
        self._high_since: float | None = None
        self.estimate = 0.0
        self.rate = 0.0  # items/s claimed over the window

    def observe(self, now: float, *, queued: int, claimed_total: int) -> float:
        """Add a sample; returns the new estimate (seconds)."""
        if math.isinf(self.estimate) and self._samples and claimed_total > self._samples[-1][1]:
            last = self._samples[-1]  # claims resumed: the rate counts from here
            self._samples = deque([last])
        self._samples.append((now, claimed_total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        first_at, first_claimed = self._samples[0]
        span = now - first_at
        rate = (claimed_total - first_claimed) / span if span > 0 else 0.0
        self.rate = rate
        if queued <= 0:
            self.estimate = 0.0
        elif rate > 0:
            self.estimate = queued / rate
        else:
            self.estimate = math.inf if span >= min(self.window_s, 0.5) else 0.0
        if self.estimate > self.threshold_s:
            self._high_since = now if self._high_since is None else self._high_since
        else:
            self._high_since = None
        return self.estimate

    def high_for(self, now: float) -> float:
        """How long the estimate has stayed above the threshold (0 when it is not above)."""
        return 0.0 if self._high_since is None else now - self._high_since


class HelperStarts:
    """A helper's start, fleet-wide: seconds from its creation (the fleet's decision) to the
    first sample in which its run id held leases (process start, Prefect, stores: 3.6 s on a
    quiet box, 17-29 s on a loaded one, so it is measured, not assumed). The expected start is
    the median of the last ``keep`` measured (one slow start does not swing it), ``prior_s``
    before any was measured. A helper that never claimed (its source drained first) is not
    counted: what it would have taken is unknown."""

    def __init__(
        self, prior_s: float = defaults.FLEET_START_PRIOR_S, keep: int = defaults.FLEET_START_KEEP
    ) -> None:
        self.prior_s = prior_s
        self._seen: deque[float] = deque(maxlen=max(1, keep))
        self.measured = 0  # how many were measured in all

    def add(self, seconds: float) -> None:
        """One helper's start, measured."""
        self._seen.append(max(0.0, seconds))
        self.measured += 1

    @property
    def expected_s(self) -> float:
        """What a helper asked for now is expected to take to its first claim."""
        if not self._seen:
            return self.prior_s
        ordered = sorted(self._seen)
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2


class Held:
    """Since when a condition has held without a break (a sustained-load window)."""

    def __init__(self) -> None:
        self._since: float | None = None

    def observe(self, now: float, holds: bool) -> None:
        """One observation: a break restarts the window."""
        if not holds:
            self._since = None
        elif self._since is None:
            self._since = now

    def reset(self) -> None:
        """Restart the window (the helper count changed: what held before no longer says)."""
        self._since = None

    def held_for(self, now: float) -> float:
        """How long the condition has held (0 when it does not)."""
        return 0.0 if self._since is None else now - self._since


def with_helpers(loads: Iterable[SourceLoad], helpers: Mapping[str, int]) -> list[SourceLoad]:
    """The same loads with the helper counts replaced (what a round of actions leads to)."""
    return [replace(x, helpers=helpers.get(x.source, x.helpers)) for x in loads]


def _seconds(value: float) -> str:
    if math.isinf(value):
        return "inf (nothing claims)"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
