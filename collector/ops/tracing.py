"""OpenTelemetry traces of Collector: a span per batch, an event per dead letter.

Built on ``opentelemetry-api``, which Prefect already depends on and uses for its own flow- and
task-run spans. With nothing configured the API's tracer is a no-op: spans are
non-recording, trace ids are 0 (stored as ``""`` on dead letters), nothing is exported, and
the cost is a few object creations per batch.

Export is configured by the standard ``OTEL_*`` variables; :func:`init_tracing` (run once per
process, where Sentry is set up) installs the SDK's tracer provider only when one of
``OTEL_TRACES_EXPORTER`` (not ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set and ``OTEL_SDK_DISABLED`` is not true. The SDK and
the OTLP/HTTP exporter are the optional extra ``collector[otel]``; the exporter reads its
endpoint, headers, timeout and compression from the environment itself.

The span tree of one batch (``collector.batch``)::

    Prefect task run ``fetch-batch[...]`` (when Prefect's telemetry is on: it is by default)
      collector.batch            claim time .. ack; event ``claim``; attributes: source, token,
        collector.fetch          items, results per status
        collector.validate       the GX round trip of the batch
        collector.store          the sink write under the lease's token
        collector.ack            the frontier ack
        (event ``dead_letter`` per dead letter: stage, error class, attempts, retry count, id)
        collector.dead_letter    one per dead letter, status ERROR: error.type, cause, id, URL

The batch span starts inside the fetch task (so Prefect's task-run span is its parent) with its
start time set back to the claim, and ends after the ack, outliving the task: settling runs
behind fetching. A dead letter's ``trace_id`` is the trace of the span current where it is made
(the batch's, or the flow run's for URLs refused at plan), so ``collector deadletters show``
leads to the trace from fetch to quarantine. Dead-letter events follow the OpenTelemetry
messaging conventions where they fit (``messaging.operation.type = send`` to the destination
``dead-letters``, ``messaging.message.id`` = the dead-letter id, ``error.type`` = the error
class), with the dead-letter seed's names beside them (``messaging.dlq.reason``,
``messaging.dlq.level``, ``messaging.retry_count``); stage, attempts and retry count are also
``collector.dead_letter.*`` attributes. An entry keeps the id of its ``collector.dead_letter``
span, so triage, replay and review link to that very span.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

if TYPE_CHECKING:
    from collector.deadletter import DeadLetter
    from collector.fetch.engine import FetchResult
    from collector.frontier import Lease

__all__ = [
    "BatchTraces",
    "cause_of",
    "dead_letter_attributes",
    "dead_letter_event",
    "dead_letter_level",
    "fetched",
    "init_tracing",
    "link_entry",
    "link_to_origin",
    "recovery_span",
    "trace_id_of_current",
]

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer("collector")
_initialised = False


def _wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def init_tracing() -> bool:
    """Install the SDK's tracer provider when ``OTEL_*`` asks for export; once per process.

    Returns True when spans are exported. Leaves a provider someone else installed alone.
    A missing SDK or an unknown exporter is one warning line, not a failed run.
    """
    global _initialised
    if _initialised:
        return _sdk_installed()
    _initialised = True
    if not _wanted():
        return False
    if _sdk_installed():
        return True
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_* asks for traces but opentelemetry-sdk is not installed: "
            "pip install 'collector[otel]'; no traces are exported"
        )
        return False
    exporter = _exporter()
    if exporter is None:
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": _service_name()}))
    if isinstance(exporter, str):  # console
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # flush what the batch processor still holds
    return True


def _service_name() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or "collector"


def _exporter() -> Any:
    """The span exporter ``OTEL_TRACES_EXPORTER`` / ``OTEL_EXPORTER_OTLP_*PROTOCOL`` name."""
    env = os.environ
    kind = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if kind == "console":
        return "console"
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if kind != "otlp" or protocol != "http/protobuf":
        logger.warning(
            "OTEL_TRACES_EXPORTER=%s with protocol %s is not supported (otlp over "
            "http/protobuf, or console); no traces are exported",
            kind,
            protocol,
        )
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        logger.warning(
            "OTEL_* asks for OTLP traces but opentelemetry-exporter-otlp-proto-http is not "
            "installed: pip install 'collector[otel]'; no traces are exported"
        )
        return None
    return OTLPSpanExporter()


def _sdk_installed() -> bool:
    provider = trace.get_tracer_provider()
    return type(provider).__module__.startswith("opentelemetry.sdk")


def trace_id_of_current() -> str:
    """The current span's trace id as 32 hex digits, or ``""`` when nothing is traced."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.trace_id else ""


def cause_of(letter: DeadLetter) -> str:
    """``collector.dead_letter.cause``: why fetching gave up (``retries_exhausted``,
    ``max_total_exceeded``), or ``permanent`` for an error that is never retried."""
    return letter.cause or "permanent"


def dead_letter_level(letter: DeadLetter) -> int:
    """``messaging.dlq.level``: 1 for the quarantine (archive and store), 2 for the
    manual-review queue an entry is escalated to (docs/deadletters.md, the levels)."""
    return 2 if letter.status == "review" else 1


def dead_letter_attributes(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter's attributes: OpenTelemetry's messaging conventions where they fit, the
    dead-letter seed's names (``messaging.dlq.*``, ``messaging.retry_count``) and Collector's
    own (``collector.dead_letter.*``), so a query written against any of them finds it."""
    retries = max(letter.attempts - 1, 0)
    return {
        "messaging.operation.type": "send",
        "messaging.operation.name": "quarantine",
        "messaging.destination.name": "dead-letters",
        "messaging.message.id": letter.id,
        "messaging.retry_count": retries,
        "messaging.dlq.reason": letter.reason,
        "messaging.dlq.level": dead_letter_level(letter),
        "error.type": letter.error_class,
        "collector.dead_letter.cause": cause_of(letter),
        "collector.dead_letter.stage": letter.stage,
        "collector.dead_letter.attempts": letter.attempts,
        "collector.dead_letter.retry_count": retries,
        "collector.source": letter.source,
    }


def dead_letter_event(letter: DeadLetter) -> str:
    """Record ``letter`` as an event of the current span and as a ``collector.dead_letter``
    span with status ERROR under it; the new span's id as 16 hex digits (what a later link to
    it needs), or ``""`` when the current span does not record."""
    span = trace.get_current_span()
    if not span.is_recording():
        return ""
    attributes = dead_letter_attributes(letter)
    span.add_event("dead_letter", attributes)
    failed = _tracer.start_span(
        "collector.dead_letter", attributes={**attributes, "url.full": letter.url}
    )
    failed.set_status(trace.Status(trace.StatusCode.ERROR, f"{letter.reason}: dead-lettered"))
    failed.end()
    span_id = failed.get_span_context().span_id
    return format(span_id, "016x") if span_id else ""


def link_to_origin(entry: DeadLetter) -> trace.Link | None:
    """A span link to the ``collector.dead_letter`` span in which ``entry`` failed (None when
    it was not traced). An entry stored before span ids were kept has its trace id only: the
    link then names the trace, with span id 0; its attributes name the dead letter either way
    (an SDK keeps such a link because it has attributes)."""
    trace_id = _hex(entry.trace_id, 32)
    if not trace_id:
        return None
    span_id = _hex(entry.span_id, 16) or trace.INVALID_SPAN_ID
    context = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(1))
    return trace.Link(
        context,
        {"collector.link.kind": "dead_letter_origin", "messaging.message.id": entry.id},
    )


def _hex(text: str, digits: int) -> int:
    """``text`` as an id of exactly ``digits`` hex digits, else 0 (not traced, or garbled)."""
    try:
        return int(text, 16) if len(text) == digits else 0
    except ValueError:
        return 0


@contextlib.contextmanager
def recovery_span(
    name: str, source: str, entries: Sequence[DeadLetter] = (), **attributes: Any
) -> Iterator[trace.Span]:
    """``collector.<name>`` (triage, replay, review, compensate) as the current span, linked to
    the original trace of each of ``entries``; more can be linked with :func:`link_entry`.

    An exception ends it with status ERROR (and is re-raised)."""
    init_tracing()
    links = [link for entry in entries if (link := link_to_origin(entry)) is not None]
    values = {"collector.source": source, **{f"collector.{k}": v for k, v in attributes.items()}}
    if len(entries) == 1:
        values["messaging.message.id"] = entries[0].id
    with _tracer.start_as_current_span(f"collector.{name}", links=links, attributes=values) as span:
        yield span


def link_entry(span: trace.Span, entry: DeadLetter) -> None:
    """Link ``span`` to the trace in which ``entry`` failed (when traced and recording)."""
    link = link_to_origin(entry)
    if link is not None and span.is_recording():
        span.add_link(link.context, link.attributes)


def fetched(span: trace.Span, results: Sequence[FetchResult]) -> None:
    """Results per status as attributes of the fetch span (skipped when it does not record)."""
    if not span.is_recording():
        return
    # Every status gets an attribute (0 when none), whatever FetchResult.status grows into:
    # a status missing here once failed whole runs (the breaker's "deferred").
    counts = Counter({status: 0 for status in _STATUSES})
    counts.update(result.status for result in results)
    span.set_attributes({f"collector.results.{k}": v for k, v in counts.items()})


_STATUSES = ("ok", "failed", "skipped", "deferred")


class BatchTraces:
    """The open ``collector.batch`` spans of one run, by lease token."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._claims: dict[int, tuple[int, int, int]] = {}  # token -> (start, end ns, reclaimed)
        self._spans: dict[int, trace.Span] = {}

    def claimed(self, lease: Lease, started_ns: int) -> None:
        """Remember when the batch was claimed: its span starts there."""
        if lease.items:
            self._claims[lease.token] = (started_ns, time.time_ns(), lease.reclaimed)

    def _open(self, lease: Lease) -> trace.Span:
        span = self._spans.get(lease.token)
        if span is not None:
            span.add_event("fetch_retry")  # Prefect runs the fetch task again
            return span
        started_ns, claimed_ns, reclaimed = self._claims.pop(
            lease.token, (time.time_ns(), time.time_ns(), 0)
        )
        span = _tracer.start_span(
            "collector.batch",
            start_time=started_ns,
            attributes={
                "collector.source": self.source,
                "collector.lease.token": lease.token,
                "collector.batch.items": len(lease.items),
            },
        )
        if span.is_recording():
            span.add_event(
                "claim",
                {"collector.batch.items": len(lease.items), "collector.reclaimed": reclaimed},
                timestamp=claimed_ns,
            )
        self._spans[lease.token] = span
        return span

    @contextlib.contextmanager
    def fetching(self, lease: Lease) -> Iterator[trace.Span]:
        """Open the batch span (child of the current one) and a ``collector.fetch`` in it."""
        batch = self._open(lease)
        with (
            trace.use_span(batch, end_on_exit=False),
            _tracer.start_as_current_span("collector.fetch") as span,
        ):
            yield span

    @contextlib.contextmanager
    def settling(self, lease: Lease) -> Iterator[trace.Span]:
        """Make the batch span current while settling; end it when settling ends."""
        batch = self._spans.get(lease.token) or self._open(lease)
        try:
            with trace.use_span(batch, end_on_exit=False, record_exception=True):
                yield batch
        finally:
            self._spans.pop(lease.token, None)
            batch.end()

    def released(self, lease: Lease) -> None:
        """The batch went back unchanged (its task failed for good): end its span as an error."""
        self._claims.pop(lease.token, None)
        span = self._spans.pop(lease.token, None)
        if span is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "batch released"))
            span.end()

    @staticmethod
    def step(name: str) -> contextlib.AbstractContextManager[trace.Span]:
        """A child span of the current one (``collector.validate``, ``.store``, ``.ack``)."""
        return _tracer.start_as_current_span(f"collector.{name}")
