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
    timeout = next(e for e in archived if "timeout" in e["error_class"])  # 3 attempts
    assert _attributes(events[timeout["id"]][1])["collector.dead_letter.retry_count"] == 2


def test_without_an_sdk_span_nothing_is_traced() -> None:
    """The API's no-op path: no current span, no trace id, no event (and no error)."""
    assert tracing.trace_id_of_current() == ""
    letter = DeadLetter(
        source="s", url="http://x/", stage="fetch", error_class="http_404", message="m",
        attempts=1, first_seen=0.0, last_seen=0.0,
    )  # fmt: skip
    tracing.dead_letter_event(letter)  # does nothing, raises nothing


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
