"""The four TTLs and the check that they fit together.

=============  =================================================================  ===============
TTL            meaning                                                            enforced by
=============  =================================================================  ===============
freshness      a fetched URL stays fresh this long; planning skips it             planner
queue          a job waiting longer than this is *expired* (counted, not dropped) frontier
execution      per-request deadline (HTTP timeout <= it) and the batch task's     fetch engine,
               ``timeout_seconds``                                                Prefect task
lease          how long a claim lives without renewal (renewed at lease / 3)      frontier
=============  =================================================================  ===============

The order ``http_timeout_s <= request_deadline_s <= batch_timeout_s < lease_s`` is what makes the
guarantees hold: a request cannot outlive its deadline, a batch cannot outlive its task timeout,
and a batch's items cannot be claimed by someone else while the batch is still being worked.
A source that breaks the order is refused when it is loaded, naming the fields.

Freshness is chosen per URL: the first matching rule wins (regex ``pattern`` searched in the
URL, or plain ``prefix``); an optional ``hook`` (dotted path to ``f(url) -> seconds | None``) is
asked first, and ``None`` from it falls through to the rules, then ``default_fresh_s``.

``revisit: adaptive`` (with ``budget_per_hour``) replaces those fixed intervals by learned ones
(collector.policy.revisit_budget), kept within ``[min_fresh_s, max_fresh_s]``; the fixed ones
stay the default, and the guess for a page fetched only once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collector import defaults
from collector._hooks import resolve_callable
from collector.policy._urlmatch import UrlMatch

__all__ = ["FreshnessRule", "TTLSettings", "alignment_problems"]


class FreshnessRule(UrlMatch):
    """One per-URL freshness rule. Exactly one of ``pattern`` or ``prefix``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fresh_s: float = Field(ge=0, description="Seconds a matching URL stays fresh; 0 = never.")


_ORDER = ("http_timeout_s", "request_deadline_s", "batch_timeout_s", "lease_s")


def alignment_problems(values: Mapping[str, Any]) -> list[str]:
    """Why the execution TTLs in ``values`` do not fit together (empty when they do).

    Works on raw values too (missing keys take the defaults, non-numbers are skipped), so a
    source with other errors in its ``ttl`` section still hears about misaligned TTLs.
    """
    known: dict[str, float | None] = {
        "http_timeout_s": defaults.HTTP_TIMEOUT_S,
        "request_deadline_s": defaults.REQUEST_DEADLINE_S,
        "batch_timeout_s": defaults.BATCH_TIMEOUT_S,
        "lease_s": defaults.LEASE_S,
    }
    for name in _ORDER:
        value = values.get(name, known[name])
        known[name] = value if isinstance(value, (int, float)) and value > 0 else None
    problems = []
    for lower_name, upper_name in itertools.pairwise(_ORDER):
        lower, upper = known[lower_name], known[upper_name]
        if lower is None or upper is None:
            continue
        if upper_name == "lease_s" and not lower < upper:
            problems.append(
                f"lease_s ({upper:g} s) must be greater than batch_timeout_s ({lower:g} s), "
                "or a batch could outlive its lease"
            )
        elif upper_name != "lease_s" and lower > upper:
            problems.append(
                f"{lower_name} ({lower:g} s) must be <= {upper_name} ({upper:g} s): "
                "http_timeout_s <= request_deadline_s <= batch_timeout_s < lease_s"
            )
    return problems


class TTLSettings(BaseModel):
    """The ``ttl:`` section of a source. All durations in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_fresh_s: float = Field(
        defaults.DEFAULT_FRESH_S, ge=0, description="Freshness of URLs no rule matches."
    )
    rules: tuple[FreshnessRule, ...] = Field((), description="Per-URL freshness; first match wins.")
    hook: str | None = Field(
        None, description="Dotted path to f(url) -> seconds | None, asked before the rules."
    )
    queue_ttl_s: float = Field(defaults.QUEUE_TTL_S, gt=0, description="Queue expiry.")
    http_timeout_s: float = Field(defaults.HTTP_TIMEOUT_S, gt=0, description="httpx timeout.")
    request_deadline_s: float = Field(
        defaults.REQUEST_DEADLINE_S, gt=0, description="Wall-clock deadline of one request."
    )
    batch_timeout_s: float = Field(
        defaults.BATCH_TIMEOUT_S, gt=0, description="Prefect timeout_seconds of a fetch batch."
    )
    lease_s: float = Field(defaults.LEASE_S, gt=0, description="Claim lifetime without renewal.")
    revisit: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="fixed: the freshness rules decide when a page is due again; adaptive: "
        "each page's learned change rate and budget_per_hour (docs/revisits.md).",
    )
    budget_per_hour: float | None = Field(
        None, gt=0, description="revisit: adaptive only: refetches an hour the source spends."
    )
    min_fresh_s: float = Field(
        defaults.MIN_FRESH_S, gt=0, description="revisit: adaptive: shortest learned interval."
    )
    max_fresh_s: float = Field(
        defaults.MAX_FRESH_S, gt=0, description="revisit: adaptive: longest learned interval."
    )
    min_gain_s: float = Field(
        0.0,
        ge=0,
        description="revisit: adaptive: the least freshness (seconds, for a page of the "
        "source's weight) one refetch must be expected to buy; the budget is left unspent "
        "where fetches buy less. 0: spend the whole budget.",
    )

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        problems = alignment_problems(self.model_dump()) + self._revisit_problems()
        if problems:  # one a line: the source's loader reports each as a problem of its own
            raise ValueError("\n".join(problems))
        return self

    def _revisit_problems(self) -> list[str]:
        problems = []
        if self.revisit == "adaptive" and self.budget_per_hour is None:
            problems.append("revisit: adaptive needs budget_per_hour (refetches an hour to spend)")
        if self.revisit == "fixed" and self.budget_per_hour is not None:
            problems.append(
                "budget_per_hour is only read with revisit: adaptive (revisit is fixed)"
            )
        if self.revisit == "fixed" and self.min_gain_s > 0:
            problems.append("min_gain_s is only read with revisit: adaptive (revisit is fixed)")
        if self.min_fresh_s > self.max_fresh_s:
            problems.append(
                f"min_fresh_s ({self.min_fresh_s:g} s) must be <= max_fresh_s "
                f"({self.max_fresh_s:g} s)"
            )
        return problems

    @cached_property
    def _hook(self) -> Callable[[str], float | None] | None:
        return resolve_callable(self.hook, field="ttl.hook") if self.hook else None

    def validate_hook(self) -> None:
        """Import the hook now so a bad dotted path fails at load time, not mid-run."""
        _ = self._hook

    def fresh_for(self, url: str) -> float:
        """Seconds that ``url`` stays fresh after a successful fetch."""
        if self._hook is not None:
            chosen = self._hook(url)
            if chosen is not None:
                return max(0.0, float(chosen))
        for rule in self.rules:
            if rule.matches(url):
                return rule.fresh_s
        return self.default_fresh_s

    @property
    def renew_every_s(self) -> float:
        """How often a lease holder renews its lease."""
        return self.lease_s / 3
