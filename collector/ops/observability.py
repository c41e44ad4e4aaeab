"""Sentry for Collector: set up once when ``SENTRY_DSN`` is set, scrubbed, and not noisy.

Choices, and why:

* **Nothing without a DSN.** :func:`init_sentry` returns ``False`` and does not even import
  ``sentry_sdk`` when ``SENTRY_DSN`` is unset (or empty); every capture helper is then a cheap
  no-op, so the hot path pays nothing.
* **Fast options.** ``sentry_sdk.init`` with its default and auto-enabling integrations costs
  ~2.5 s (it probes and patches dozens of libraries). Collector turns both off and enables only
  what it uses: logging (INFO and up become breadcrumbs, never events: Prefect logs every failed
  run at ERROR, which would duplicate the run's own event), atexit (flush the queue when the
  process ends), dedupe (the same exception object is sent once) and excepthook.
  No tracing, no local variables in stack frames (they may hold secrets under harmless names),
  no default PII.
* **Scrubbed in ``before_send``** (and ``before_breadcrumb``) with collector.ops.scrub.Scrubber:
  every string of the event (message, exception values, tags, extra, breadcrumbs, request) loses
  the *known secret values* registered with :func:`register_secrets` (each loaded source's
  resolved ``${env:...}``/``${secret:...}`` values, see ``Source.secret_values``) and secret-looking
  URL query parameters; mapping keys named like credentials (``authorization``, ``token``...)
  lose their values whatever they are. Dead letters are already scrubbed before they get here:
  this is the second layer.
* **One event per error class, not per item.** A 20,000-URL crawl whose site returns 404
  everywhere must not send 20,000 events. :class:`DeadLetterReporter` sends, per run, one event
  the first time a ``(stage, error_class)`` is dead-lettered (with that batch's count and one
  scrubbed example), and at the end of the run one summary event per class that grew after it
  (total count). So at most two events per class per run; the fingerprint
  ``[collector-dead-letter, source, stage, error_class]`` groups runs into one Sentry issue.
* **Failed runs** (exception, unbalanced ledger) are captured once by the collect flow's
  ``on_failure`` hook with the same tags (``source``, ``stage=run``, ``flow_run_id``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from collector.ops.scrub import process_scrubber, remember_secrets

if TYPE_CHECKING:
    from collector.deadletter import DeadLetter

__all__ = [
    "DeadLetterReporter",
    "capture_failed_run",
    "init_sentry",
    "register_secrets",
    "sentry_enabled",
    "shutdown_sentry",
]

# Process-wide: Sentry's SDK is initialised once per process; this records that it was.
_lock = threading.Lock()
_enabled = False


def sentry_enabled() -> bool:
    """True once :func:`init_sentry` set Sentry up in this process."""
    return _enabled


def register_secrets(values: Iterable[str]) -> None:
    """Add resolved secret values that must never leave in a Sentry event (nor a log line)."""
    remember_secrets(values)


def scrub_event(event: dict[str, Any], hint: Any = None) -> dict[str, Any]:
    """``before_send``: the event with every known secret and credential-like value removed."""
    scrubbed: dict[str, Any] = process_scrubber()(event)
    return scrubbed


def _scrub_breadcrumb(crumb: dict[str, Any], hint: Any = None) -> dict[str, Any]:
    scrubbed: dict[str, Any] = process_scrubber()(crumb)
    return scrubbed


def init_sentry(*, dsn: str | None = None, transport: Any = None) -> bool:
    """Set Sentry up once for this process if a DSN is given or in ``SENTRY_DSN``.

    ``transport`` is for tests (an in-memory ``sentry_sdk.transport.Transport``). Returns whether
    Sentry is on. Environment and release come from ``SENTRY_ENVIRONMENT``/``SENTRY_RELEASE``.
    """
    global _enabled
    dsn = dsn if dsn is not None else os.environ.get("SENTRY_DSN", "").strip()
    if not dsn:
        return _enabled
    with _lock:
        if _enabled:
            return True
        import sentry_sdk
        from sentry_sdk.integrations.atexit import AtexitIntegration
        from sentry_sdk.integrations.dedupe import DedupeIntegration
        from sentry_sdk.integrations.excepthook import ExcepthookIntegration
        from sentry_sdk.integrations.logging import LoggingIntegration

        sentry_sdk.init(
            dsn=dsn,
            default_integrations=False,
            auto_enabling_integrations=False,
            integrations=[
                LoggingIntegration(level=logging.INFO, event_level=None),
                AtexitIntegration(),
                DedupeIntegration(),
                ExcepthookIntegration(),
            ],
            transport=transport,
            before_send=scrub_event,  # type: ignore[arg-type]
            before_breadcrumb=_scrub_breadcrumb,
            include_local_variables=False,
            # no PII: the default (send_default_pii is deprecated, and passing it warns)
            traces_sample_rate=None,
            max_breadcrumbs=50,
            environment=os.environ.get("SENTRY_ENVIRONMENT") or None,
            release=os.environ.get("SENTRY_RELEASE") or None,
        )
        _enabled = True
    return True


def shutdown_sentry(timeout_s: float = 2.0) -> None:
    """Flush and close the client (tests, or a process that wants to end cleanly)."""
    global _enabled
    with _lock:
        if not _enabled:
            return
        import sentry_sdk

        sentry_sdk.flush(timeout=timeout_s)
        sentry_sdk.get_client().close(timeout=timeout_s)
        sentry_sdk.get_global_scope().set_client(None)
        _enabled = False


def _capture(
    message: str,
    *,
    tags: Mapping[str, str],
    fingerprint: list[str] | None = None,
    context: Mapping[str, Any] | None = None,
    error: BaseException | None = None,
) -> None:
    import sentry_sdk

    with sentry_sdk.new_scope() as scope:
        for name, value in tags.items():
            scope.set_tag(name, value)
        if fingerprint:
            scope.fingerprint = fingerprint
        if context:
            scope.set_context("collector", dict(context))
        if error is not None:
            scope.set_extra("summary", message)
            sentry_sdk.capture_exception(error)
        else:
            sentry_sdk.capture_message(message, level="error")


def capture_failed_run(
    *, source: str, flow_run_id: str, error: BaseException | None, message: str = ""
) -> None:
    """One event for a collect run that failed (exception or unbalanced ledger)."""
    if not _enabled:
        return
    tags = {"source": source, "stage": "run", "flow_run_id": flow_run_id}
    text = f"collect run of {source} failed: {message or error}"
    _capture(text, tags=tags, error=error, context={"message": message})


class DeadLetterReporter:
    """Permanent errors of one run to Sentry, aggregated per ``(stage, error_class)``."""

    def __init__(self, source: str, flow_run_id: str) -> None:
        self.source = source
        self.flow_run_id = flow_run_id
        self.counts: dict[tuple[str, str], int] = {}
        self.reported: dict[tuple[str, str], int] = {}

    def report(self, letters: Iterable[DeadLetter]) -> None:
        """Count ``letters``; the first of each class in this run is sent at once."""
        if not _enabled:
            return
        batch: dict[tuple[str, str], list[DeadLetter]] = {}
        for letter in letters:
            batch.setdefault((letter.stage, letter.error_class), []).append(letter)
        for key, group in batch.items():
            self.counts[key] = self.counts.get(key, 0) + len(group)
            if key not in self.reported:
                self.reported[key] = self.counts[key]
                example = group[0]
                self._send(
                    key,
                    f"{len(group)} dead letter(s) {key[0]}/{key[1]} in {self.source}: "
                    f"{example.message}",
                    {"count": len(group), "example_url": example.url, "first_in_run": True},
                )

    def finish(self) -> None:
        """One summary event per class that grew after its first event."""
        if not _enabled:
            return
        for key, total in self.counts.items():
            if total > self.reported.get(key, 0):
                self.reported[key] = total
                self._send(
                    key,
                    f"{total} dead letter(s) {key[0]}/{key[1]} in this run of {self.source}",
                    {"count": total, "first_in_run": False},
                )

    def _send(self, key: tuple[str, str], message: str, context: dict[str, Any]) -> None:
        stage, error_class = key
        _capture(
            message,
            tags={
                "source": self.source,
                "stage": stage,
                "error_class": error_class,
                "flow_run_id": self.flow_run_id,
            },
            fingerprint=["collector-dead-letter", self.source, stage, error_class],
            context=context,
        )
