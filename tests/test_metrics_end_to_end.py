"""A real `collector run` against the fault site, scraped by a real Prometheus, traced to a
real OTLP/HTTP endpoint.

One subprocess run (the `collector` command as a user starts it, with ``--metrics-port`` and
``OTEL_EXPORTER_OTLP_ENDPOINT``) serves both sides:

* Prometheus (Debian's ``prometheus``, on free ports, in a temp folder) scrapes it every
  second; the test queries Prometheus' HTTP API, and every value is compared with an
  independent account: the run's JSON summary, the dead-letter store, the site's own log.
* a tiny ``http.server`` accepts the exporter's protobuf POSTs and decodes them with
  ``opentelemetry-proto``: the batch spans and one dead-letter event per dead letter arrive,
  with the trace ids stored on the dead letters.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collector.config import load_source
from collector.deadletter import SqliteDeadLetterStore
from collector.demo.scenario import write_demo_source
from collector.demo.site import FaultSite
from tests.helpers import as_from_a_terminal
from tests.servers import end_process, free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = pytest.mark.slow


class PrometheusServer:
    """``with PrometheusServer(targets) as prom: prom.query(expr)``: a throwaway Prometheus
    scraping ``targets`` (host:port) every second, on a free port, data in a temp folder."""

    def __init__(self, targets: list[str]) -> None:
        if not Path(PROMETHEUS).exists():
            raise RuntimeError("prometheus is not installed (./bootstrap test installs it)")
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="collector-prometheus-"))
        config = {
            "global": {
                "scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s",
            },
            "rule_files": [str(ROOT / "infra" / "prometheus" / "alerts.yaml")],
            "scrape_configs": [{"job_name": "collector", "static_configs": [{"targets": targets}]}],
        }  # fmt: skip
        (self.folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        with (self.folder / "prometheus.log").open("wb") as log:  # the child keeps its copy
            self._process = subprocess.Popen(
                [
                    PROMETHEUS, f"--config.file={self.folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip
        try:
            wait_ready(
                self._process, f"{self.url}/-/ready", log=self.folder / "prometheus.log",
                timeout_s=60,
            )  # fmt: skip
        except RuntimeError:
            self.__exit__()  # not left running (nor its folder) when it did not start in time
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        process, self._process = self._process, None
        if process is not None:  # SIGTERM, then SIGKILL if it hangs (tests/servers.py)
            end_process(process, process.terminate, grace_s=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: labels (without __name__) -> value."""
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return {
            tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(
                r["value"][1]
            )
            for r in body["data"]["result"]
        }

    def scalar(self, expr: str) -> float:
        values = list(self.query(expr).values())
        assert len(values) == 1, (expr, values)
        return values[0]


@dataclass
class OtlpReceiver:
    """POST /v1/traces of OTLP/HTTP (protobuf), decoded; answers like a collector does."""

    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    port: int = 0

    def __enter__(self) -> OtlpReceiver:
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and (
                    self.headers["Content-Type"] == "application/x-protobuf"
                )
                if ok:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of everything received."""
        found: list[tuple[dict[str, Any], Any]] = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope.spans)
        return found


@dataclass
class Observed:
    summary: dict[str, Any]
    metrics: dict[str, Any]
    site_statuses: list[int]
    spans: list[tuple[dict[str, Any], Any]]
    archive: list[dict[str, Any]]
    reasons: dict[str, int]
    dashboard: dict[str, bool]  # each dashboard query -> found data
    scrape: str  # the run's /metrics, as Prometheus read it
    receiver: OtlpReceiver  # still listening: later commands export to it too
    source_path: Path
    env: dict[str, str]  # the run's environment (Prefect API, OTLP endpoint)


def dashboard_queries() -> list[str]:
    """Every PromQL of infra/grafana/collector.json with Grafana's variables filled in."""
    board = json.loads((ROOT / "infra" / "grafana" / "collector.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    fill = {"$source": ".*", "$__rate_interval": "1m", "$__range": "10m"}
    for name, value in fill.items():
        exprs = [e.replace(name, value) for e in exprs]
    return exprs


# Everything the test reads from Prometheus, queried while the run still serves its endpoint
# (after it is gone, Prometheus marks its series stale).
QUERIES = {
    "runs_ok": 'sum(collector_runs_total{source="demo-items",result="ok"})',
    "requests_by_class": "sum by (status_class) (collector_requests_total)",
    "requests_by_host": "sum by (host) (collector_requests_total)",
    "dead_letters": "sum by (stage, error_class) (collector_dead_letters_total)",
    "records": "sum by (outcome) (collector_records_total)",
    "retries": "sum(collector_retries_total)",
    "budget_refusals": "sum(collector_retry_budget_refusals_total) or vector(0)",
    "frontier": 'sum by (state) (collector_frontier_items{source="demo-items"})',
    "backlog_level": "collector_backlog_level",
    "latency_count": "sum(collector_request_duration_seconds_count)",
    "claims": "sum(collector_claim_duration_seconds_count)",
    "settles": "sum(collector_settle_duration_seconds_count)",
    "gx": "sum(collector_validation_duration_seconds_count)",
    "lock_waits": "sum(collector_source_lock_wait_seconds_count)",
    "last_success": "collector_last_success_timestamp_seconds",
    "prefect_client_series": "count({__name__=~'prefect_.*'}) or vector(0)",
    # the seeds' names
    "status_codes": "sum by (code) (http_client_status_code_count_total)",
    "status_codes_recorded": "sum by (code) (http_client_status_code_count)",  # recording rule
    "http_retries": "sum(http_client_retry_count_total)",
    "backlog_bytes": 'collector_source_backlog_bytes{source="demo-items"}',
    "claim_waits": "sum(collector_frontier_claim_wait_seconds_count)",
    "slot_waits": 'sum(collector_host_slot_wait_seconds_count{scope="engine"})',
}


# Nothing renews a lease, reclaims one or refuses a write in the short run of these tests.
_ALLOWED_EMPTY = (
    "collector_lease_renewals_total",
    "collector_fence_refusals_total",
    "collector_leases_reclaimed_total",
    "collector_retry_budget_refusals",
    "collector_fleet_",  # a `collector run` alone: no fleet (tests/test_fleet_model.py has them)
)


def _may_be_empty(query: str) -> bool:
    return any(name in query for name in _ALLOWED_EMPTY)


@pytest.fixture(scope="module")
def observed(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    folder = tmp_path_factory.mktemp("metrics-e2e")
    metrics_port = free_port()
    with (
        FaultSite() as site,
        OtlpReceiver() as receiver,
        PrometheusServer([f"127.0.0.1:{metrics_port}"]) as prometheus,
    ):
        source_path = write_demo_source(folder, site.base_url)
        env = {
            **os.environ,
            "PREFECT_API_URL": prefect_api,
            "PYTHONPATH": str(ROOT),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_SERVICE_NAME": "collector-e2e",
        }
        run = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", str(source_path), "--json",
             "--batch-size", "50", "--metrics-port", str(metrics_port), "--metrics-hold", "30"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env,
            preexec_fn=as_from_a_terminal,  # the Ctrl-C that ends the hold reaches it
        )  # fmt: skip
        # stderr read as it comes: the line that says the hold began (after the summary)
        assert run.stderr is not None
        errors: list[bytes] = []
        holding = threading.Event()
        held_at: list[float] = []

        def read_errors(stream: Any = run.stderr) -> None:
            for line in stream:
                errors.append(line)
                if b"(--metrics-hold); Ctrl-C ends it now" in line:
                    held_at.append(time.monotonic())
                    holding.set()

        reader = threading.Thread(target=read_errors, daemon=True)
        reader.start()
        try:
            metrics: dict[str, Any] = {}
            dashboard: dict[str, bool] = {}
            scrape = ""
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and run.poll() is None:
                if any(v >= 1 for v in prometheus.query(QUERIES["runs_ok"]).values()):
                    time.sleep(2)  # a rule evaluation (every second) after the last scrape
                    metrics = {name: prometheus.query(q) for name, q in QUERIES.items()}
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{metrics_port}/metrics", timeout=10
                    ) as answer:
                        scrape = answer.read().decode()
                    # rate()/increase() need two samples of a series: one that first appeared
                    # in the run's last seconds gets its second scrape while the endpoint is
                    # held open (--metrics-hold), so look again for a while before judging.
                    settle = time.monotonic() + 15
                    while True:
                        dashboard = {q: bool(prometheus.query(q)) for q in dashboard_queries()}
                        missing = [q for q, found in dashboard.items() if not found]
                        if all(map(_may_be_empty, missing)) or time.monotonic() > settle:
                            break
                        time.sleep(1)
                    break
                time.sleep(0.5)
            # Everything is read: end the hold's last seconds with a Ctrl-C (the run's exit
            # code stands; tests/test_operator_truth.py) rather than wait them out; never in
            # its last 5 s, when the Ctrl-C could meet the process on its way out instead.
            if metrics and holding.wait(timeout=120) and time.monotonic() - held_at[0] < 25:
                run.send_signal(signal.SIGINT)
            run.wait(timeout=120)
            assert run.stdout is not None
            out = run.stdout.read()
            reader.join(timeout=30)
            err = b"".join(errors)
        finally:
            if run.poll() is None:
                run.kill()
            for pipe in (run.stdout, run.stderr):
                if pipe is not None:
                    pipe.close()
        assert run.returncode == 0, err.decode()[-3000:]
        assert metrics, "Prometheus never saw the run end:\n" + err.decode()[-3000:]
        # The slow URL answers 5 s after each of its three requests, whatever the client did
        # (it gave up after 1 s), and the site logs an answer when it sends it: wait for the
        # three (the whole 30 s hold used to give them the time), or the count below is short.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(1 for r in site.requests if "delay=" in r.path) >= 3:
                break
            time.sleep(0.1)
        source = load_source(source_path)
        store = SqliteDeadLetterStore(source.deadletter_path)
        try:
            reasons = store.reasons(source.name)
        finally:
            store.close()
        yield Observed(
            summary=json.loads(out.decode().strip().splitlines()[-1]),
            metrics=metrics,
            # pages only: the run's robots.txt request (a 404 here) is not a page request
            site_statuses=[r.status for r in site.requests if r.path != "/robots.txt"],
            spans=receiver.spans(),
            archive=[
                json.loads(line)
                for line in source.deadletter_archive_path.read_text("utf-8").splitlines()
            ],
            reasons=reasons,
            dashboard=dashboard,
            scrape=scrape,
            receiver=receiver,
            source_path=source_path,
            env=env,
        )


def _one(values: dict[Any, float]) -> float:
    assert len(values) == 1, values
    return next(iter(values.values()))


def _by(values: dict[Any, float], *labels: str) -> dict[Any, float]:
    out = {}
    for key, value in values.items():
        found = dict(key)
        out[tuple(found.get(label, "") for label in labels)] = value
    return out


def test_prometheus_scrapes_the_run_and_every_series_matches_an_independent_count(
    observed: Observed,
) -> None:
    m, summary = observed.metrics, observed.summary
    assert summary["balanced"] and _one(m["runs_ok"]) == 1
    assert m["last_success"] and _one(m["last_success"]) <= time.time()

    # Requests: the run's own count, and per status class what the site says it answered.
    by_class = {k[0]: v for k, v in _by(m["requests_by_class"], "status_class").items()}
    assert sum(by_class.values()) == summary["requests"]
    assert by_class.get("4xx") == sum(1 for s in observed.site_statuses if 400 <= s < 500) == 2
    assert by_class.get("5xx") == sum(1 for s in observed.site_statuses if 500 <= s < 600)
    assert by_class.get("error") == 3  # the slow URL's three timeouts
    assert _one(m["latency_count"]) == summary["requests"] - 0  # no attempt cut off here
    # The demo source does not opt in to host labels (metrics.hosts): every host is "other".
    assert {k[0] for k in _by(m["requests_by_host"], "host")} == {"other"}

    # The seeds' names: exact codes, the site's own statuses (plus "error" for the timeouts),
    # and the same under the recording rule's name.
    codes = {k[0]: v for k, v in _by(m["status_codes"], "code").items()}
    # A redirect hop is part of the attempt that followed it (its final status counts), and
    # the slow URL's three 200s came after the client gave up (they count as "error").
    site_codes = Counter(str(s) for s in observed.site_statuses if not 300 <= s < 400)
    site_codes["200"] -= 3
    assert codes == {**site_codes, "error": 3}
    assert {k[0]: v for k, v in _by(m["status_codes_recorded"], "code").items()} == codes
    assert _one(m["http_retries"]) == summary["retries"]
    assert _one(m["backlog_bytes"]) == 0  # drained: nothing owed
    assert _one(m["claim_waits"]) == _one(m["claims"])
    assert _one(m["slot_waits"]) == summary["requests"]

    # Dead letters by stage and class: exactly what the dead-letter archive received.
    dead = {f"{s}/{c}": v for (s, c), v in _by(m["dead_letters"], "stage", "error_class").items()}
    archived = Counter(f"{e['stage']}/{e['error_class']}" for e in observed.archive)
    assert dead == dict(archived) and sum(dead.values()) == sum(observed.reasons.values()) == 5
    assert dead["fetch/http_404"] == observed.site_statuses.count(404)

    records = {k[0]: v for k, v in _by(m["records"], "outcome").items()}
    assert records == {
        "written": summary["records_written"],
        "quarantined": summary["records_quarantined"],
    }
    assert _one(m["retries"]) == summary["retries"]
    assert _one(m["budget_refusals"]) == summary["retry_budget_refused"]

    frontier = {k[0]: v for k, v in _by(m["frontier"], "state").items()}
    assert frontier["done"] == summary["stored"] and frontier["dead"] == summary["dead_lettered"]
    assert frontier["queued"] == frontier["leased"] == 0
    assert _one(m["backlog_level"]) == 0

    assert _one(m["claims"]) >= summary["batches"]
    assert _one(m["settles"]) == summary["batches"]
    assert _one(m["gx"]) >= 1
    assert _one(m["lock_waits"]) == 1
    # Prefect's own client metrics come from the same endpoint (one server, one registry).
    assert _one(m["prefect_client_series"]) > 0


def test_traces_reach_an_otlp_http_endpoint_with_the_dead_letters(observed: Observed) -> None:
    spans = observed.spans
    assert spans, "no spans were exported"
    assert {resource["service.name"] for resource, _ in spans} == {"collector-e2e"}
    batches = [span for _, span in spans if span.name == "collector.batch"]
    assert len(batches) == observed.summary["batches"]
    task_runs = {
        span.span_id
        for _, span in spans
        if any(
            a.key == "prefect.run.type" and a.value.string_value == "task" for a in span.attributes
        )
    }
    assert all(batch.parent_span_id in task_runs for batch in batches)

    events = {
        next(a.value.string_value for a in e.attributes if a.key == "messaging.message.id"): batch
        for batch in batches
        for e in batch.events
        if e.name == "dead_letter"
    }
    assert len(observed.archive) == observed.summary["dead_lettered"] == 5
    for entry in observed.archive:
        assert entry["trace_id"] == events[entry["id"]].trace_id.hex()


def test_promtool_check_metrics_accepts_the_runs_endpoint(observed: Observed) -> None:
    """The run's whole endpoint (Collector's series beside Prefect's), as scraped."""
    assert "http_client_status_code_count_total{" in observed.scrape
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=observed.scrape, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _collector(observed: Observed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, cwd=ROOT,
        env=observed.env, timeout=300,
    )  # fmt: skip


def test_one_items_life_is_found_by_its_trace_id(observed: Observed) -> None:
    """A dead letter's trace id finds its failure (an ERROR span with its cause) and, through
    span links, the triage that escalated it and the review that settled it, all exported
    over OTLP/HTTP by three separate processes (run, triage, review)."""
    entry = next(e for e in observed.archive if e["error_class"] == "http_404")
    triaged = _collector(observed, "triage", str(observed.source_path), "--json")
    assert triaged.returncode == 0, triaged.stderr[-3000:]
    reviewed = _collector(
        observed, "review", str(observed.source_path), "--id", entry["id"],
        "--discard", "gone for good", "--reviewer", "e2e",
    )  # fmt: skip
    assert reviewed.returncode == 0, reviewed.stdout + reviewed.stderr[-3000:]

    trace_id = bytes.fromhex(entry["trace_id"])
    deadline = time.monotonic() + 60  # the exporters flush at exit; the receiver is threaded
    life: list[Any] = []
    while time.monotonic() < deadline:
        life = [
            span for _, span in observed.receiver.spans()
            if span.trace_id == trace_id
            or any(link.trace_id == trace_id and _attr(link, "messaging.message.id") == entry["id"]
                   for link in span.links)
        ]  # fmt: skip
        if {"collector.triage", "collector.review"} <= {span.name for span in life}:
            break
        time.sleep(0.5)
    names = Counter(span.name for span in life)
    assert names["collector.batch"] >= 1 and names["collector.triage"] == 1, names
    assert names["collector.review"] == 1, names
    (failed,) = [
        s for s in life
        if s.name == "collector.dead_letter" and _attr(s, "messaging.message.id") == entry["id"]
    ]  # fmt: skip
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert _attr(failed, "error.type") == "http_404"
    assert _attr(failed, "collector.dead_letter.cause") == "permanent"
    (review,) = [s for s in life if s.name == "collector.review"]
    assert review.trace_id != trace_id  # another trace, linked
    assert _attr(review, "collector.decision") == "discard"
    (triage,) = [s for s in life if s.name == "collector.triage"]
    outcomes = {
        _attr(e, "messaging.message.id"): _attr(e, "collector.triage.outcome")
        for e in triage.events
    }
    assert outcomes[entry["id"]] == "escalated"


def _attr(item: Any, key: str) -> Any:
    """An OTLP attribute's value (string, int or bool) of a span, event or link."""
    for attribute in item.attributes:
        if attribute.key == key:
            value = attribute.value
            return getattr(value, value.WhichOneof("value"))
    return None


def test_every_dashboard_query_runs_on_prometheus(observed: Observed) -> None:
    """Each panel's PromQL, with Grafana's variables filled in, is valid and finds data."""
    assert observed.dashboard, "no dashboard queries were run"
    empty = [expr for expr, found in observed.dashboard.items() if not found]
    assert [e for e in empty if not _may_be_empty(e)] == []


def test_promtool_accepts_the_alert_rules_and_their_unit_tests(tmp_path: Path) -> None:
    folder = ROOT / "infra" / "prometheus"
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(folder / "alerts.yaml")], capture_output=True
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    assert b"SUCCESS" in checked.stdout
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yaml"], capture_output=True, cwd=folder
    )
    assert tested.returncode == 0, tested.stdout.decode() + tested.stderr.decode()

    # Both checks can fail: a syntax error, and a threshold that no longer fires.
    (tmp_path / "alerts.yaml").write_text(
        (folder / "alerts.yaml").read_text().replace("expr:", "expr: sum(", 1)
    )
    refused = subprocess.run(
        [PROMTOOL, "check", "rules", str(tmp_path / "alerts.yaml")], capture_output=True
    )
    assert refused.returncode != 0
    (tmp_path / "alerts.yaml").write_text(
        (folder / "alerts.yaml").read_text().replace("> 0.05", "> 0.5")
    )
    (tmp_path / "alerts_test.yaml").write_text((folder / "alerts_test.yaml").read_text())
    failed = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yaml"], capture_output=True, cwd=tmp_path
    )
    assert failed.returncode != 0
    assert b"CollectorDeadLetterRate" in failed.stdout + failed.stderr
