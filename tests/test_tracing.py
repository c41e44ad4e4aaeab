"""Traces of a real collect flow run (real Prefect API, real fault site) in the SDK's memory.

The span tree must be Prefect's flow run -> Prefect's fetch-batch task run -> collector.batch ->
fetch / validate / store / ack, every dead letter an event on its batch's span, and every dead
letter in the archive must carry the trace id of the batch that made it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector.config import load_source
from collector.deadletter import DeadLetter
from collector.demo.scenario import write_demo_source
from collector.demo.site import FaultSite
from collector.ops import tracing
from flows.collect import collect
from tests.helpers import summary_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this process (the global one can be set only once)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


def _attributes(item: ReadableSpan | Event) -> Mapping[str, Any]:
    """A span's or an event's attributes: optional in the SDK's types, set on all of these."""
    assert item.attributes is not None
    return item.attributes


def _by_id(finished: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {span.context.span_id: span for span in finished}


@pytest.mark.usefixtures("prefect_api")
async def test_batch_spans_hang_under_prefect_task_runs_and_carry_dead_letters(
    tmp_path: Path, site: FaultSite, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    source_path = write_demo_source(tmp_path, site.base_url)
    summary = summary_of(await collect(source=str(source_path), batch_size=50))
    assert summary["balanced"] and summary["dead_lettered"] == 5

    finished = spans.get_finished_spans()
    by_id = _by_id(finished)
    batches = [s for s in finished if s.name == "collector.batch"]
    assert len(batches) == summary["batches"] >= 3  # 129 items in batches of 50

    flow_runs = [s for s in finished if _attributes(s).get("prefect.run.type") == "flow"]
    assert len(flow_runs) == 1
    trace_id = flow_runs[0].context.trace_id
    for batch in batches:
        assert batch.context.trace_id == trace_id  # one trace from the flow run down
        assert batch.parent is not None  # a batch span always has its task run's as parent
        parent = by_id[batch.parent.span_id]
        assert _attributes(parent)["prefect.run.type"] == "task"
        assert parent.name.startswith("fetch-batch[demo-items]")
        assert batch.events[0].name == "claim"
        assert batch.start_time is not None and batch.end_time is not None  # ended spans
        assert batch.start_time <= batch.events[0].timestamp <= batch.end_time
        children = Counter(
            s.name for s in finished if s.parent and s.parent.span_id == batch.context.span_id
        )
        assert children["collector.fetch"] == 1
        assert children["collector.store"] == 1
        assert children["collector.ack"] == 1
        assert children["collector.validate"] <= 1
    assert sum(1 for s in finished if s.name == "collector.validate") >= 1

    # Every dead letter: one event on its batch's span, and the batch's trace id on the entry.
    source = load_source(source_path)
    archived = [
        json.loads(line)
        for line in source.deadletter_archive_path.read_text(encoding="utf-8").splitlines()
    ]
    assert len(archived) == 5 and all(row["event"] == "quarantined" for row in archived)
    events = {
        _attributes(event)["messaging.message.id"]: (batch, event)
        for batch in batches
        for event in batch.events
        if event.name == "dead_letter"
    }
    assert len(events) == 5
    for entry in archived:
        batch, event = events[entry["id"]]
        assert entry["trace_id"] == format(batch.context.trace_id, "032x") != "0" * 32
        assert _attributes(event)["collector.dead_letter.stage"] == entry["stage"]
        assert _attributes(event)["error.type"] == entry["error_class"]
        assert _attributes(event)["collector.dead_letter.attempts"] == entry["attempts"]
        assert _attributes(event)["collector.dead_letter.retry_count"] == entry["attempts"] - 1
        assert _attributes(event)["messaging.operation.type"] == "send"
        # the seed's names beside OTel's and Collector's own
        assert _attributes(event)["messaging.retry_count"] == entry["attempts"] - 1
        assert _attributes(event)["messaging.dlq.level"] == 1  # the quarantine, not review
        assert _attributes(event)["messaging.dlq.reason"] in (
            f"{entry['stage']}/{entry['error_class']}",
            f"{entry['stage']}/{entry['cause']}:{entry['error_class']}",
        )
        # the entry names its own collector.dead_letter span, which a recovery links to
        (own,) = [
            s
            for s in finished
            if s.name == "collector.dead_letter"
            and _attributes(s)["messaging.message.id"] == entry["id"]
        ]
        assert entry["span_id"] == format(own.context.span_id, "016x")
    timeout = next(e for e in archived if "timeout" in e["error_class"])  # 3 attempts
    assert _attributes(events[timeout["id"]][1])["collector.dead_letter.retry_count"] == 2


def test_without_an_sdk_span_nothing_is_traced() -> None:
    """The API's no-op path: no current span, no trace id, no event (and no error)."""
    assert tracing.trace_id_of_current() == ""
    letter = DeadLetter(
        source="s", url="http://x/", stage="fetch", error_class="http_404", message="m",
        attempts=1, first_seen=0.0, last_seen=0.0,
    )  # fmt: skip
    assert tracing.dead_letter_event(letter) == ""  # does nothing, raises nothing


def test_the_fetch_span_counts_every_result_status() -> None:
    """A deferred result (an open breaker) once raised KeyError here and failed the run."""
    from collector.fetch.engine import FetchResult

    span = TracerProvider().get_tracer("test").start_span("fetch")
    Status = Literal["ok", "failed", "skipped", "deferred"]
    statuses: list[Status] = ["ok", "ok", "failed", "skipped", "deferred", "deferred", "deferred"]
    results = [
        FetchResult(f"https://e.test/{n}", status, 1, 0.0, f"https://e.test/{n}", 200, b"{}")
        for n, status in enumerate(statuses)
    ]
    tracing.fetched(span, results)
    span.end()
    assert isinstance(span, ReadableSpan)
    assert {k: v for k, v in _attributes(span).items() if k.startswith("collector.results.")} == {
        "collector.results.ok": 2,
        "collector.results.failed": 1,
        "collector.results.skipped": 1,
        "collector.results.deferred": 3,
    }


_PROBE = """
from opentelemetry import trace
from collector.ops.tracing import init_tracing
print(init_tracing(), type(trace.get_tracer_provider()).__module__)
"""


@pytest.mark.parametrize(
    ("env", "exported", "provider"),
    [
        ({}, "False", "opentelemetry.trace"),  # the API's proxy: nothing configured
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, "True", "opentelemetry.sdk.trace"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "True", "opentelemetry.sdk.trace"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, "False",
         "opentelemetry.trace"),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, "False",
         "opentelemetry.trace"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"},
         "False", "opentelemetry.trace"),
    ],
)  # fmt: skip
def test_the_sdk_is_installed_only_when_otel_variables_ask(
    env: dict[str, str], exported: str, provider: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == [exported, provider]
    if env.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "grpc":  # one warning line, not a failure
        assert "not supported" in done.stderr


def _letter(trace_id: str = "", cause: str = "", error_class: str = "http_404") -> DeadLetter:
    return DeadLetter(
        source="s", url="http://x/1", stage="fetch", error_class=error_class, message="m",
        attempts=3 if cause else 1, first_seen=0.0, last_seen=0.0, cause=cause,
        trace_id=trace_id,
    )  # fmt: skip


def test_a_dead_letter_is_a_span_of_its_own_with_status_error_and_its_cause(
    spans: InMemorySpanExporter,
) -> None:
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("collector.batch") as batch:
        letters = [
            _letter(tracing.trace_id_of_current()),
            _letter(tracing.trace_id_of_current(), "retries_exhausted", "http_503"),
        ]
        span_ids = [tracing.dead_letter_event(letter) for letter in letters]
    finished = spans.get_finished_spans()
    failed = [s for s in finished if s.name == "collector.dead_letter"]
    assert len(failed) == 2
    for span, letter, span_id in zip(failed, letters, span_ids, strict=True):
        assert span_id == format(span.context.span_id, "016x")  # what the entry keeps
        assert span.status.status_code is trace.StatusCode.ERROR
        assert span.parent is not None and span.parent.span_id == batch.get_span_context().span_id
        assert format(span.context.trace_id, "032x") == letter.trace_id
        attributes = _attributes(span)
        assert attributes["messaging.message.id"] == letter.id
        assert attributes["error.type"] == letter.error_class
        assert attributes["url.full"] == letter.url
    assert [_attributes(s)["collector.dead_letter.cause"] for s in failed] == [
        "permanent", "retries_exhausted",
    ]  # fmt: skip
    (parent,) = [s for s in finished if s.name == "collector.batch"]
    assert [e.name for e in parent.events] == ["dead_letter", "dead_letter"]  # events stay


def test_recovery_spans_link_to_the_trace_in_which_each_entry_failed(
    spans: InMemorySpanExporter,
) -> None:
    spans.clear()
    traced = _letter("0af7651916cd43dd8448eb211c80319c")
    untraced = _letter("")  # nothing was traced when it failed: no link
    later = _letter("4bf92f3577b34da6a3ce929d0e0e4736", "retries_exhausted", "timeout")
    with tracing.recovery_span("triage", "s", [traced, untraced], run_id="r1") as span:
        tracing.link_entry(span, later)
        with tracing.recovery_span("replay", "s", [traced], batch="triage:r1"):
            pass
    finished = {s.name: s for s in spans.get_finished_spans()}
    links = {
        name: [(format(link.context.trace_id, "032x"), dict(link.attributes or {}))
               for link in finished[f"collector.{name}"].links]
        for name in ("triage", "replay")
    }  # fmt: skip
    kind = {"collector.link.kind": "dead_letter_origin"}
    assert links == {
        "triage": [
            (traced.trace_id, {**kind, "messaging.message.id": traced.id}),
            (later.trace_id, {**kind, "messaging.message.id": later.id}),
        ],
        "replay": [(traced.trace_id, {**kind, "messaging.message.id": traced.id})],
    }
    assert _attributes(finished["collector.replay"])["messaging.message.id"] == traced.id
    assert _attributes(finished["collector.triage"])["collector.run_id"] == "r1"
    assert tracing.link_to_origin(_letter("not hex at all, but 32 chars....")) is None


def test_a_link_points_at_the_dead_letter_span_itself_when_its_id_was_kept() -> None:
    """Entries keep their ``collector.dead_letter`` span's id: the link names that span;
    an entry from before span ids were kept links to its trace with span id 0."""
    kept = _letter("0af7651916cd43dd8448eb211c80319c")
    kept.span_id = "00f067aa0ba902b7"
    link = tracing.link_to_origin(kept)
    assert link is not None
    assert link.context.span_id == 0x00F067AA0BA902B7
    assert link.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    older = _letter("0af7651916cd43dd8448eb211c80319c")
    old_link = tracing.link_to_origin(older)
    assert old_link is not None and old_link.context.span_id == trace.INVALID_SPAN_ID
    garbled = _letter("0af7651916cd43dd8448eb211c80319c")
    garbled.span_id = "not-hex-at-all!!"
    garbled_link = tracing.link_to_origin(garbled)
    assert garbled_link is not None and garbled_link.context.span_id == trace.INVALID_SPAN_ID


def test_an_escalated_entry_is_level_two() -> None:
    letter = _letter("0af7651916cd43dd8448eb211c80319c")
    assert tracing.dead_letter_attributes(letter)["messaging.dlq.level"] == 1
    letter.status = "review"
    assert tracing.dead_letter_attributes(letter)["messaging.dlq.level"] == 2


def test_compensating_a_batch_links_to_where_its_pages_once_failed(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A real JSONL sink and SQLite dead-letter store: the batch holds the page of one dead
    letter (traced) and one page that never failed; the span links to that one trace."""
    from collector.deadletter import SqliteDeadLetterStore
    from collector.run.ledger import LedgerBook, compensate
    from collector.sinks.base import SinkRecord
    from collector.sinks.jsonl import JsonlSink

    spans.clear()
    failed = _letter("0af7651916cd43dd8448eb211c80319c")
    other = DeadLetter(
        source="s", url="http://x/elsewhere", stage="fetch", error_class="http_404", message="m",
        attempts=1, first_seen=0.0, last_seen=0.0, trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )  # fmt: skip
    store = SqliteDeadLetterStore(tmp_path / "dl.db")
    sink = JsonlSink(tmp_path / "sink", source="s")
    try:
        store.put([failed, other])
        sink.write(
            [SinkRecord("1", {"id": 1}, failed.url), SinkRecord("2", {"id": 2}, "http://x/2")],
            token=1, batch_id="review:e2e:1",
        )  # fmt: skip
        done = compensate(
            sink, LedgerBook(tmp_path / "ledger.jsonl"), source="s", batch_id="review:e2e:1",
            reason="test", deadletters=store,
        )  # fmt: skip
    finally:
        store.close()
        sink.close()
    assert done.removed == 2
    (span,) = [s for s in spans.get_finished_spans() if s.name == "collector.compensate"]
    linked = [
        (format(link.context.trace_id, "032x"), (link.attributes or {}).get("messaging.message.id"))
        for link in span.links
    ]
    assert linked == [(failed.trace_id, failed.id)]
    assert _attributes(span)["collector.batch"] == "review:e2e:1"
    assert _attributes(span)["collector.compensate.removed"] == 2
