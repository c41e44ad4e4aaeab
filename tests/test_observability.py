"""Sentry: nothing without a DSN; scrubbed, aggregated events with tags through the real flow.

Events go to an in-memory ``sentry_sdk.transport.Transport`` (a real implementation of the
SDK's transport interface that keeps the envelopes), never to the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from collector.deadletter import DeadLetter
from collector.demo.site import FaultSite
from collector.ops import observability
from flows.collect import collect
from tests.helpers import summary_of, write_source

if TYPE_CHECKING:
    from sentry_sdk._types import Event  # a TypedDict that exists for type checkers only

ROOT = Path(__file__).resolve().parents[1]
DSN = "https://public@sentry.invalid/1"  # never contacted: the transport is in memory
QUERY_SECRET = "q-secret-4f9a1c"
HEADER_SECRET = "h-secret-77b2e0d1"
OTHER_SECRET = "o-secret-5c3e9a20"  # only the failing run's source knows this one


class MemoryTransport(Transport):
    """Keeps every envelope the SDK would send."""

    envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        MemoryTransport.envelopes.append(envelope)


def _events() -> list[Event]:
    events = []
    for envelope in MemoryTransport.envelopes:
        event = envelope.get_event()
        if event is not None:
            events.append(event)
    return events


def _raw() -> str:
    return "".join(
        envelope.serialize().decode("utf-8", "replace") for envelope in MemoryTransport.envelopes
    )


@pytest.fixture
def sentry() -> Iterator[None]:
    MemoryTransport.envelopes = []
    assert observability.init_sentry(dsn=DSN, transport=MemoryTransport) is True
    try:
        yield
    finally:
        observability.shutdown_sentry()


def test_without_a_dsn_nothing_is_initialised() -> None:
    code = (
        "import sys\n"
        "from collector.ops import observability\n"
        "from collector.run.collection import Collection\n"
        "assert observability.init_sentry() is False\n"
        "assert not observability.sentry_enabled()\n"
        "assert 'sentry_sdk' not in sys.modules, 'sentry_sdk was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SENTRY_DSN"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_before_send_scrubs_known_values_urls_and_credential_fields(sentry: None) -> None:
    observability.register_secrets([HEADER_SECRET])
    event = {
        "message": f"failed with Bearer {HEADER_SECRET}",
        "request": {
            "url": f"https://api.example/items?id=3&token={QUERY_SECRET}",
            "headers": {"Authorization": "Basic opaque-value-1234", "Accept": "json"},
        },
        "exception": {"values": [{"type": "X", "value": f"http://h/?api_key={QUERY_SECRET}"}]},
        "breadcrumbs": {"values": [{"message": f"header {HEADER_SECRET}"}]},
        "extra": {"password": "hunter2-long"},
    }
    scrubbed = json.dumps(observability.scrub_event(event))
    for secret in (HEADER_SECRET, QUERY_SECRET, "opaque-value-1234", "hunter2-long"):
        assert secret not in scrubbed
    assert "json" in scrubbed and "id=3" in scrubbed  # harmless values stay


def _letter(i: int, error_class: str) -> DeadLetter:
    return DeadLetter(
        source="s",
        url=f"http://h/{i}",
        stage="fetch",
        error_class=error_class,
        message=f"HTTP 404 for item {i}",
        attempts=1,
        first_seen=0.0,
        last_seen=0.0,
        flow_run_id="run-1",
    )


def test_dead_letters_are_one_event_per_class_then_one_summary(sentry: None) -> None:
    reporter = observability.DeadLetterReporter("s", "run-1")
    reporter.report([_letter(i, "http_404") for i in range(3)] + [_letter(9, "http_410")])
    reporter.report([_letter(i, "http_404") for i in range(3, 20_000)])  # a 20,000-URL crawl
    reporter.finish()
    observability.shutdown_sentry()
    events = _events()
    assert len(events) == 3  # first 404, first 410, one 404 summary: not 20,001
    by_class = [(e["tags"]["error_class"], e["contexts"]["collector"]["count"]) for e in events]
    assert by_class == [("http_404", 3), ("http_410", 1), ("http_404", 20_000)]
    assert {e["tags"]["stage"] for e in events} == {"fetch"}
    assert events[0]["fingerprint"] == ["collector-dead-letter", "s", "fetch", "http_404"]


@pytest.mark.usefixtures("prefect_api")
async def test_flow_reports_permanent_errors_and_failed_runs_without_secrets(
    tmp_path: Path, site: FaultSite, sentry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTOR_TEST_TOKEN", HEADER_SECRET)
    monkeypatch.setenv("COLLECTOR_OTHER_TOKEN", OTHER_SECRET)
    headers = {"Authorization": "Bearer ${env:COLLECTOR_TEST_TOKEN}"}
    good = tmp_path / "good"
    good.mkdir()
    missing = [site.url(f"/missing/{i}.json?token={QUERY_SECRET}") for i in range(3)]
    source = write_source(
        good,
        name="sentry-items",
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 4], "urls": missing},
        limits={"headers": headers},
    )
    summary = summary_of(await collect(source=str(source), batch_size=50))
    assert summary["dead_lettered"] == 3 and summary["balanced"] is True

    # A run that fails: its sink folder cannot be created, and the OS error names the path,
    # which here contains that source's header secret value.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "blocker").write_text("a file, not a folder", encoding="utf-8")
    failing = write_source(
        bad,
        name="failing-items",
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 2]},
        limits={"headers": {"X-Api-Key": "${env:COLLECTOR_OTHER_TOKEN}"}},
        sink={"type": "jsonl", "path": f"blocker/{OTHER_SECRET}"},
    )
    with pytest.raises(Exception, match="cannot create folder"):
        await collect(source=str(failing), batch_size=50)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        e.get("tags", {}).get("stage") == "run" for e in _events()
    ):
        time.sleep(0.1)  # the on_failure hook has run by now; this is only a safety margin
    observability.shutdown_sentry()
    events = _events()
    permanent = [e for e in events if e.get("tags", {}).get("error_class") == "http_404"]
    assert len(permanent) == 1  # three 404s in one batch: one event
    assert permanent[0]["tags"] == {
        "source": "sentry-items",
        "stage": "fetch",
        "error_class": "http_404",
        "flow_run_id": summary["run_id"],
    }
    assert permanent[0]["contexts"]["collector"]["count"] == 3
    runs = [e for e in events if e.get("tags", {}).get("stage") == "run"]
    assert len(runs) == 1
    assert runs[0]["tags"]["source"] == "failing-items"
    assert runs[0]["tags"]["flow_run_id"] not in ("", summary["run_id"])
    assert "cannot create folder" in json.dumps(runs[0])
    raw = _raw()
    for secret in (QUERY_SECRET, HEADER_SECRET, OTHER_SECRET):
        assert secret not in raw
