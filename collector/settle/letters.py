"""Dead letters as a run writes them: scrubbed, traced, and matchable by their real URL.

One :class:`Letters` per run, shared by the plan (seeds refused before the frontier) and the
settling of batches (pages that failed, records that failed validation), so every dead letter a
run writes carries the same run id, the same scrubbing of secrets and the same trace link.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collector.deadletter import DeadLetter
from collector.deadletter.base import url_digest
from collector.errors import FetchError
from collector.fetch.engine import FetchResult
from collector.ops import tracing
from collector.ops.scrub import Scrubber
from collector.settle.rowsplit import FailedExpectation

__all__ = ["BODY_EXCERPT", "Letters", "expectation_dict"]

BODY_EXCERPT = 2048  # bytes of a failing body kept in its dead letter


class Letters:
    """Builds one run's dead letters (see the module docstring)."""

    def __init__(
        self, source: str, run_id: str, scrub: Scrubber, clock: Callable[[], float]
    ) -> None:
        self.source = source
        self.run_id = run_id
        self.scrub = scrub
        self.clock = clock

    def letter(
        self,
        url: str,
        stage: str,
        error_class: str,
        message: str,
        attempts: int,
        *,
        key: str = "",
        payload: Any = None,
        failed: list[dict[str, Any]] | None = None,
        cause: str = "",
    ) -> DeadLetter:
        now = self.clock()
        letter = DeadLetter(
            source=self.source,
            url=self.scrub.url(url),
            stage=stage,  # type: ignore[arg-type]
            error_class=error_class,
            message=self.scrub.text(message),
            attempts=attempts,
            first_seen=now,
            last_seen=now,
            record_key=key,
            payload=self.scrub(payload),
            failed_expectations=failed or [],
            flow_run_id=self.run_id,
            cause=cause,
            trace_id=tracing.trace_id_of_current(),  # the batch's trace (the plan's at plan)
            url_digest=url_digest(url),  # the real URL, matchable once scrubbed (run/replan.py)
        )
        letter.span_id = tracing.dead_letter_event(letter)
        return letter

    def refused(self, url: str, reason: str) -> DeadLetter:
        """A seed the plan refused (malformed or forbidden URL): never fetched."""
        return self.letter(url, "plan", "refused_url", reason, 0)

    def fetch(self, result: FetchResult, error: FetchError, *, body: bytes = b"") -> DeadLetter:
        """A page that failed for good (fetch or parse), with an excerpt of its body."""
        payload: dict[str, Any] = {"http_status": result.http_status}
        if body:
            payload["body_excerpt"] = body[:BODY_EXCERPT].decode("utf-8", "replace")
            payload["body_bytes"] = len(body)
        cause = result.decision.cause if result.decision else ""
        return self.letter(
            result.url,
            error.stage,
            error.error_class,
            f"{error}{_given_up(cause, error)}",
            result.attempts,
            payload=payload,
            cause=cause,
        )

    def record(
        self,
        result: FetchResult,
        record: dict[str, Any],
        error_class: str,
        message: str,
        *,
        key: str = "",
        failed: list[dict[str, Any]] | None = None,
    ) -> DeadLetter:
        """A record that failed (no usable key, or the suite), with the record as payload."""
        return self.letter(
            result.url,
            "validate",
            error_class,
            message,
            result.attempts,
            key=key,
            payload=record,
            failed=failed,
        )


def _given_up(cause: str, error: FetchError) -> str:
    """Why a recoverable error (a 429, a 503) was not tried again before the attempts ran out:
    its dead letter must not read as a failure retrying could not have helped."""
    if cause != "max_total_exceeded":
        return ""  # retries_exhausted: the attempt count beside the message says it
    asked = error.retry_after_s  # kept short: a listing cuts the message at ~100 characters
    wait = f"waiting Retry-After {asked:g} s" if asked is not None else "the next try"
    return f"; given up: {wait} would pass retry.max_total_s (or a profile's max_duration_s)"


def expectation_dict(failed: FailedExpectation) -> dict[str, Any]:
    """A failed expectation as a dead letter keeps it."""
    return {
        "expectation": failed.expectation,
        "column": failed.column,
        "kwargs": failed.kwargs,
        "message": failed.message,
    }
