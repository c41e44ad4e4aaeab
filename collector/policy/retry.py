"""When to try a URL again, and when to stop.

A failed attempt is one of two kinds (``collector.errors``): *permanent* errors (404 and other
4xx except 408/429, parse and schema errors, refused URLs, oversized bodies) are never retried;
*recoverable* ones (timeouts, connection errors, 408, 429, 5xx) are retried under four limits:

* **backoff with full jitter**: the n-th retry waits ``uniform(0, min(cap_s, base_s x 2**(n-1)))``
  (``linear``: ``base_s x n``), which spreads retries of many workers instead of synchronising them;
* **Retry-After**: when the server says how long to wait, we wait at least that (clamped);
* **max attempts and max total duration**: counted from the item's first attempt, across batches
  and runs, so an item cannot bounce forever;
* **retry budget**: retries may be at most ``budget_ratio`` of the run's requests (after a floor of
  ``budget_min``), so a failing site sheds load instead of being hammered by a retry storm. An
  item refused by the budget is not failed: it goes back to the frontier to wait its backoff.

A short wait is done inside the batch (``max_inline_delay_s``), beside the batch's other requests;
a longer one is handed back to the frontier as a not-before time, so one slow-to-recover URL
never holds a whole batch (and a short one too, once it is all its batch still waits for:
collector.fetch.tail).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from collector import defaults
from collector.errors import FetchError

__all__ = [
    "RECOVERABLE_STATUS",
    "RetryBudget",
    "RetryDecision",
    "RetrySettings",
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


class RetrySettings(BaseModel):
    """The ``retry:`` section of a source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: Literal["exponential", "linear"] = Field(
        defaults.RETRY_PROFILE, description="Growth of the backoff ceiling."
    )
    base_s: float = Field(defaults.RETRY_BASE_S, gt=0, description="First backoff ceiling.")
    cap_s: float = Field(defaults.RETRY_CAP_S, gt=0, description="Largest backoff ceiling.")
    max_attempts: int = Field(
        defaults.MAX_ATTEMPTS, ge=1, description="Attempts per item, across runs (1 = no retry)."
    )
    max_total_s: float = Field(
        defaults.MAX_TOTAL_S, gt=0, description="No retry later than this after the first attempt."
    )
    budget_ratio: float = Field(
        defaults.RETRY_BUDGET_RATIO, ge=0, le=1, description="Max share of requests that retry."
    )
    budget_min: int = Field(
        defaults.RETRY_BUDGET_MIN, ge=0, description="Retries always allowed per run."
    )
    respect_retry_after: bool = Field(True, description="Honour the server's Retry-After.")
    max_retry_after_s: float = Field(
        defaults.MAX_RETRY_AFTER_S, gt=0, description="Clamp for Retry-After."
    )
    max_inline_delay_s: float = Field(
        defaults.MAX_INLINE_DELAY_S,
        ge=0,
        description="Backoffs up to this are waited inside the batch; longer ones are deferred.",
    )

    def ceiling(self, retry_number: int) -> float:
        """Upper bound of the ``retry_number``-th backoff (1-based)."""
        n = max(retry_number, 1)
        if self.profile == "linear":
            return min(self.cap_s, self.base_s * n)
        # 2**n overflows float past ~1024; the cap is reached long before.
        return min(self.cap_s, self.base_s * 2.0 ** min(n - 1, 60))

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Full jitter: a uniform draw in [0, ceiling)."""
        return (rng or random).uniform(0.0, self.ceiling(retry_number))

    def decide(
        self,
        error: FetchError,
        *,
        attempts: int,
        first_attempt_at: float,
        now: float,
        budget: RetryBudget | None = None,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """What to do after ``attempts`` attempts (this one included) ended in ``error``."""
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
