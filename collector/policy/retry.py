"""When to try a URL again, and when to stop.

A failed attempt is one of two kinds (``collector.errors``): *permanent* errors (404 and other
4xx except 408/429, parse and schema errors, refused URLs, oversized bodies) are never retried;
*recoverable* ones (timeouts, connection errors, 408, 429, 5xx) are retried under four limits:

* **backoff with jitter**: the n-th retry's ceiling is ``min(cap_s, base_s x multiplier**(n-1))``
  (``linear``: ``base_s x n``); ``full`` jitter (the default) waits ``uniform(0, ceiling)``,
  ``proportional`` ``ceiling x uniform(0.5, 1.5)``, ``none`` the ceiling: jitter spreads retries of
  many workers instead of synchronising them;
* **Retry-After**: when the server says how long to wait, we wait at least that (clamped);
* **max attempts and max total duration**: counted from the item's first attempt, across batches
  and runs, so an item cannot bounce forever;
* **retry budget**: retries may be at most ``budget_ratio`` of the run's requests (after a floor of
  ``budget_min``), so a failing site sheds load instead of being hammered by a retry storm. An
  item refused by the budget is not failed: it goes back to the frontier to wait its backoff.
  With ``budget_time_s``, the backoff waited *inside* batches is also capped per sliding
  ``budget_window_s`` (:class:`RetryTimeBudget`); a retry over it waits in the frontier instead.

**Named profiles**: ``profiles`` gives backoff settings by name (a payment API and a nightly
reconciliation retry differently); ``rules`` pick one per URL (first match), ``default_profile``
the rest; a source without profiles uses its own fields as before (:meth:`RetrySettings.for_url`).

A short wait is done inside the batch (``max_inline_delay_s``), beside the batch's other requests;
a longer one is handed back to the frontier as a not-before time, so one slow-to-recover URL
never holds a whole batch (and a short one too, once it is all its batch still waits for:
collector.fetch.tail).
"""

from __future__ import annotations

import difflib
import math
import random
import threading
from collections import deque
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collector import defaults
from collector.errors import FetchError
from collector.policy._urlmatch import UrlMatch

__all__ = [
    "RECOVERABLE_STATUS",
    "BackoffProfile",
    "Jitter",
    "RetryBudget",
    "RetryDecision",
    "RetryRule",
    "RetrySettings",
    "RetryTimeBudget",
    "is_recoverable_status",
    "parse_retry_after",
]

RECOVERABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504, 507, 509, 520, 521, 522, 524})


def is_recoverable_status(status: int) -> bool:
    """True when an HTTP status may succeed on a later attempt."""
    return status in RECOVERABLE_STATUS


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


Jitter = Literal["full", "proportional", "none"]
"""``full``: uniform in [0, ceiling); ``proportional``: ceiling x uniform [0.5, 1.5];
``none``: the ceiling itself."""

Growth = Literal["exponential", "linear"]


class BackoffProfile(BaseModel):
    """One named backoff profile of ``retry.profiles``; a key left out takes the section's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    growth: Growth | None = Field(None, description="exponential or linear growth.")
    base_s: float | None = Field(None, gt=0, description="First backoff ceiling.")
    cap_s: float | None = Field(None, gt=0, description="Largest backoff ceiling.")
    multiplier: float | None = Field(
        None, ge=1, le=100, description="Growth of the ceiling per retry (exponential)."
    )
    max_duration_s: float | None = Field(
        None, gt=0, description="No retry later than this after the first attempt."
    )
    max_attempts: int | None = Field(None, ge=1, description="Attempts per item, across runs.")
    jitter: Jitter | None = Field(None, description="full, proportional or none.")


class RetryRule(UrlMatch):
    """A URL rule of ``retry.rules``: the URLs it matches retry under ``profile``."""

    profile: str = Field(description="Name of a profile in retry.profiles.")


class RetrySettings(BaseModel):
    """The ``retry:`` section of a source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: Growth = Field(defaults.RETRY_PROFILE, description="Growth of the backoff ceiling.")
    base_s: float = Field(defaults.RETRY_BASE_S, gt=0, description="First backoff ceiling.")
    cap_s: float = Field(defaults.RETRY_CAP_S, gt=0, description="Largest backoff ceiling.")
    max_attempts: int = Field(
        defaults.MAX_ATTEMPTS, ge=1, description="Attempts per item, across runs (1 = no retry)."
    )
    max_total_s: float = Field(
        defaults.MAX_TOTAL_S,
        gt=0,
        description=(
            "No retry later than this after the first attempt: a page whose next wait (its "
            "backoff or Retry-After) would pass it is dead-lettered at once."
        ),
    )
    budget_ratio: float = Field(
        defaults.RETRY_BUDGET_RATIO, ge=0, le=1, description="Max share of requests that retry."
    )
    budget_min: int = Field(
        defaults.RETRY_BUDGET_MIN, ge=0, description="Retries always allowed per run."
    )
    respect_retry_after: bool = Field(True, description="Honour the server's Retry-After.")
    max_retry_after_s: float = Field(
        defaults.MAX_RETRY_AFTER_S,
        gt=0,
        description=(
            "Clamp for Retry-After (a longer one is waited this long); only waits within "
            "max_total_s (a profile's max_duration_s) happen, longer ones end the page."
        ),
    )
    max_inline_delay_s: float = Field(
        defaults.MAX_INLINE_DELAY_S,
        ge=0,
        description="Backoffs up to this are waited inside the batch; longer ones are deferred.",
    )
    multiplier: float = Field(
        defaults.RETRY_MULTIPLIER, ge=1, le=100, description="Growth of the ceiling per retry."
    )
    jitter: Jitter = Field(defaults.RETRY_JITTER, description="full, proportional or none.")
    budget_time_s: float | None = Field(
        None,
        gt=0,
        description="Backoff seconds waited inside batches per budget_window_s (none: no cap).",
    )
    budget_window_s: float = Field(
        defaults.RETRY_BUDGET_WINDOW_S, gt=0, description="Sliding window of budget_time_s."
    )
    degrade_share: float = Field(
        defaults.DEGRADE_SHARE,
        gt=0,
        le=1,
        description="Share of a host's requests sent while it answers 429 (1: all).",
    )
    degrade_hold_s: float = Field(
        defaults.DEGRADE_HOLD_S, gt=0, description="A host answers 429 this long after its last."
    )
    profiles: dict[str, BackoffProfile] = Field(
        default_factory=dict, description="Named backoff profiles."
    )
    default_profile: str | None = Field(
        None, description="Profile of URLs no rule names (none: this section's own fields)."
    )
    rules: tuple[RetryRule, ...] = Field(
        (), description="Per-URL profile choice; first match wins."
    )

    @model_validator(mode="after")
    def _profiles_consistent(self) -> Self:
        problems = []
        names = [("default_profile", self.default_profile)] + [
            (f"rules[{i}].profile", rule.profile) for i, rule in enumerate(self.rules)
        ]
        for where, name in names:
            if name is not None and name not in self.profiles:
                problems.append(f"{where}: {_unknown_profile(name, self.profiles)}")
        for name, resolved in self._resolved.items():
            if resolved.cap_s < resolved.base_s:
                problems.append(
                    f"profiles.{name}: cap_s ({resolved.cap_s:g}) is below base_s "
                    f"({resolved.base_s:g})"
                )
            if resolved.max_total_s < resolved.base_s:
                problems.append(
                    f"profiles.{name}: max_duration_s ({resolved.max_total_s:g}) is below "
                    f"base_s ({resolved.base_s:g}): no retry could ever wait its backoff"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @cached_property
    def _resolved(self) -> dict[str, RetrySettings]:
        """Each profile as a whole retry section: the profile's keys over this section's."""
        resolved = {}
        for name, p in self.profiles.items():
            given: dict[str, object] = {
                "profile": p.growth,
                "base_s": p.base_s,
                "cap_s": p.cap_s,
                "multiplier": p.multiplier,
                "max_total_s": p.max_duration_s,
                "max_attempts": p.max_attempts,
                "jitter": p.jitter,
            }
            update: dict[str, object] = {k: v for k, v in given.items() if v is not None}
            update.update(profiles={}, default_profile=None, rules=())
            resolved[name] = self.model_copy(update=update)
        return resolved

    def for_url(self, url: str) -> RetrySettings:
        """The settings ``url`` retries under: its rule's profile, else the default profile,
        else this section itself (always, for a source without profiles)."""
        if not self.profiles:
            return self
        for rule in self.rules:
            if rule.matches(url):
                return self._resolved[rule.profile]
        if self.default_profile is not None:
            return self._resolved[self.default_profile]
        return self

    def named(self, name: str) -> RetrySettings:
        """The profile ``name`` as a whole retry section."""
        return self._resolved[name]

    def ceiling(self, retry_number: int) -> float:
        """Upper bound of the ``retry_number``-th backoff (1-based)."""
        n = max(retry_number, 1)
        if self.profile == "linear":
            return min(self.cap_s, self.base_s * n)
        try:
            return min(self.cap_s, self.base_s * self.multiplier ** (n - 1))
        except OverflowError:  # m**n past float's range: long past the cap
            return self.cap_s

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """The wait before retry ``retry_number``, drawn by the jitter mode."""
        ceiling = self.ceiling(retry_number)
        if self.jitter == "full":
            return (rng or random).uniform(0.0, ceiling)
        if self.jitter == "proportional":
            return ceiling * (rng or random).uniform(0.5, 1.5)
        return ceiling

    def decide(
        self,
        error: FetchError,
        *,
        attempts: int,
        first_attempt_at: float,
        now: float,
        budget: RetryBudget | None = None,
        rng: random.Random | None = None,
        time_budget: RetryTimeBudget | None = None,
    ) -> RetryDecision:
        """What to do after ``attempts`` attempts (this one included) ended in ``error``;
        ``time_budget`` caps the backoff waited inline (an inline wait over it goes later)."""
        if error.permanent:
            return RetryDecision("dead", reason=error.error_class)
        if attempts >= self.max_attempts:
            return RetryDecision(
                "dead", reason=f"retries_exhausted:{error.error_class}", cause="retries_exhausted"
            )
        delay = self.backoff(attempts, rng)
        if self.respect_retry_after and error.retry_after_s is not None:
            delay = max(delay, min(error.retry_after_s, self.max_retry_after_s))
        if now + delay - first_attempt_at > self.max_total_s:
            return RetryDecision(
                "dead", reason=f"max_total_exceeded:{error.error_class}", cause="max_total_exceeded"
            )
        if budget is not None and not budget.try_spend():
            return RetryDecision("later", delay_s=max(delay, self.base_s), reason="retry_budget")
        if delay <= self.max_inline_delay_s:
            if time_budget is not None and not time_budget.try_spend(delay, now=now):
                return RetryDecision("later", delay_s=delay, reason="retry_time_budget")
            return RetryDecision("inline", delay_s=delay, reason=error.error_class)
        return RetryDecision("later", delay_s=delay, reason=error.error_class)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """``inline``: wait ``delay_s`` and retry now; ``later``: back to the frontier, due after
    ``delay_s``; ``dead``: stop, dead-letter with ``reason``.

    ``cause`` says why a recoverable error became dead (``retries_exhausted``,
    ``max_total_exceeded``; "" when the error was permanent): the dead letter keeps it in a
    field of its own beside the error class, while ``reason`` is the text shown in ledgers.
    """

    action: Literal["inline", "later", "dead"]
    delay_s: float = 0.0
    reason: str = ""
    cause: str = ""


class RetryBudget:
    """Retries allowed as a share of requests (thread-safe, per run and worker).

    ``try_spend`` is asked before each retry; it says no once retries would exceed
    ``max(min_retries, ratio x requests)``.
    """

    def __init__(self, *, ratio: float, min_retries: int) -> None:
        self.ratio = ratio
        self.min_retries = min_retries
        self.requests = 0
        self.retries = 0
        self.refused = 0
        self._lock = threading.Lock()

    def record_request(self) -> None:
        with self._lock:
            self.requests += 1

    def try_spend(self) -> bool:
        with self._lock:
            allowed = max(self.min_retries, self.ratio * self.requests)
            if self.retries + 1 > allowed:
                self.refused += 1
                return False
            self.retries += 1
            return True


class RetryTimeBudget:
    """Backoff seconds waited inside batches, at most ``limit_s`` per sliding ``window_s``
    (thread-safe, per engine). ``try_spend(d, now)`` grants ``d`` when the grants of the last
    ``window_s`` seconds (those at times > now - window_s) plus ``d`` stay within ``limit_s``.
    """

    def __init__(self, *, limit_s: float, window_s: float) -> None:
        self.limit_s = limit_s
        self.window_s = window_s
        self.refused = 0
        self._granted: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def try_spend(self, seconds: float, *, now: float) -> bool:
        with self._lock:
            granted = self._granted
            while granted and granted[0][0] <= now - self.window_s:
                granted.popleft()
            # fsum of the window, as a plain sum of the same grants would be (no running drift)
            if math.fsum([s for _, s in granted] + [seconds]) > self.limit_s:
                self.refused += 1
                return False
            granted.append((now, seconds))
            return True


def _unknown_profile(name: str, profiles: dict[str, BackoffProfile]) -> str:
    known = sorted(profiles)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(known) if known else "none defined in retry.profiles"
    return f"unknown profile {name!r}{hint}; profiles: {listed}"
