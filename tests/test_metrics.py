"""collector.ops.metrics: labels stay bounded, counts add up, off means off, and several
processes sum up in multiprocess mode (real processes, a real scrape, prometheus_client's own
parser). The end-to-end scrape by a real Prometheus is tests/test_metrics_end_to_end.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter as CountOf
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from collector.demo.site import FaultSite
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.ops import metrics
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture
def recording() -> Iterator[None]:
    before = metrics._enabled
    metrics.enable()
    yield
    metrics._enabled = before


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_status_classes() -> None:
    assert [metrics.status_class(s) for s in (200, 204, 302, 404, 429, 500, 503)] == [
        "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "5xx",
    ]  # fmt: skip
    assert metrics.status_class(None) == "error" == metrics.status_class(999)


def _item(url: str) -> ClaimedItem:
    return ClaimedItem(url=url, attempts=0, first_attempt_at=None, enqueued_at=0.0)


async def test_engine_requests_counted_per_batch_with_the_host_label_bounded(
    recording: None, site: FaultSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hosts (127.0.0.1 and localhost): a source that opts in to 1 host names the first
    and calls the second `other`; a source that does not opt in names none. Exact status
    codes and every request's slot wait are counted too."""
    monkeypatch.setattr(metrics, "_hosts", {})
    monkeypatch.setattr(metrics, "_named", {})
    port = site.base_url.rsplit(":", 1)[1]
    urls = [f"http://127.0.0.1:{port}/items/{i}.json" for i in range(3)]
    urls += [f"http://localhost:{port}/items/{i}.json" for i in range(2)]
    urls += [f"http://127.0.0.1:{port}/missing/1.json"]
    retry = RetrySettings(max_attempts=1)
    opted, plain = f"bounded-{uuid.uuid4().hex[:8]}", f"plain-{uuid.uuid4().hex[:8]}"
    for source, hosts in ((opted, 1), (plain, 0)):
        async with FetchEngine(
            retry=retry, host_policy=HostPolicy(allow_private_networks=True)
        ) as engine:
            assert engine.tally is not None
            results = await engine.fetch_batch(
                [_item(u) for u in urls], budget=RetryBudget(ratio=0.5, min_retries=0)
            )
            assert (
                _value(
                    "collector_requests_total", source=source, host="127.0.0.1", status_class="2xx"
                )
                + _value(
                    "collector_requests_total", source=source, host="other", status_class="2xx"
                )
                == 0
            )  # fmt: skip  (nothing until the flush)
            engine.tally.flush(source, hosts=hosts)
        assert [r.status for r in results] == ["ok"] * 5 + ["failed"]
        assert engine.tally.requests == {} and engine.tally.slot_waits == []  # flushed
    series = {
        (source, host, klass): _value(
            "collector_requests_total", source=source, host=host, status_class=klass
        )
        for source in (opted, plain)
        for host in ("127.0.0.1", "localhost", "other")
        for klass in ("2xx", "4xx")
    }
    # The named host is the first whose answer the batch counted: 127.0.0.1 on a quiet box,
    # localhost when a loaded one answers it first (seen in CI). Either way one is named.
    per_host = {"127.0.0.1": {"2xx": 3, "4xx": 1}, "localhost": {"2xx": 2}}
    named = {h for (s, h, _), v in series.items() if v and s == opted and h != "other"}
    assert len(named) == 1, f"{opted} names {sorted(named)}, one host expected: {series}"
    (first,) = named
    (rest,) = set(per_host) - named
    assert {k: v for k, v in series.items() if v} == {
        **{(opted, first, klass): n for klass, n in per_host[first].items()},
        **{(opted, "other", klass): n for klass, n in per_host[rest].items()},
        (plain, "other", "2xx"): 5, (plain, "other", "4xx"): 1,
    }  # fmt: skip
    for source in (opted, plain):
        assert _value("collector_request_duration_seconds_count", source=source,
                      status_class="2xx") == 5  # fmt: skip
        codes = {c: _value("http_client_status_code_count_total", source=source, code=c)
                 for c in ("200", "404", "other", "error")}  # fmt: skip
        assert codes == {"200": 5, "404": 1, "other": 0, "error": 0}
        assert _value("collector_host_slot_wait_seconds_count", source=source,
                      scope="engine") == len(urls)  # fmt: skip


def test_status_codes_are_exact_and_bounded() -> None:
    assert [metrics.status_code(s) for s in (200, 404, 429, 503, 599, 999, None)] == [
        "200", "404", "429", "503", "other", "other", "error",
    ]  # fmt: skip
    assert len({metrics.status_code(s) for s in range(0, 1000)}) < 70


async def test_off_means_no_tally_and_no_series() -> None:
    before = metrics._enabled
    metrics.enable(False)
    try:
        engine = FetchEngine(
            retry=RetrySettings(), host_policy=HostPolicy(allow_private_networks=True)
        )
        assert engine.tally is None
        source = f"off-{uuid.uuid4().hex[:8]}"
        metrics.run_started("r", source, "run")
        metrics.run_ended("r", "ok")
        assert _value("collector_runs_total", source=source, role="run", result="ok") == 0
    finally:
        metrics._enabled = before


_attempts = st.lists(
    st.tuples(
        st.sampled_from(["a.example", "b.example"]),
        st.one_of(  # no response, a registered status, any number (unregistered ones too)
            st.none(), st.sampled_from(sorted(int(s) for s in HTTPStatus)), st.integers(100, 999)
        ),
        st.one_of(st.none(), st.floats(0, 60)),
    ),
    max_size=40,
)


@settings(max_examples=50, deadline=None)
@given(attempts=_attempts, reasons=st.lists(st.sampled_from(["timeout", "retry_budget"])))
def test_a_flush_adds_exactly_what_was_tallied(
    attempts: list[tuple[str, int | None, float | None]], reasons: list[str]
) -> None:
    before = metrics._enabled
    metrics.enable()
    try:
        source = f"tally-{uuid.uuid4().hex}"
        tally = metrics.RequestTally()
        for host, status, seconds in attempts:
            tally.request(host, status, seconds)
        for reason in reasons:
            tally.retry(reason)
        tally.flush(source)
        tally.flush(source)  # empty now: adds nothing
    finally:
        metrics._enabled = before
    total = sum(
        _value("collector_requests_total", source=source, host="other", status_class=k)
        for k in ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
    )
    assert total == len(attempts)  # the source did not opt in: no host is named
    # Exact codes against the plain twin: a count of str(status) per registered status.
    known = {int(s) for s in HTTPStatus}
    twin = CountOf(
        "error" if st_ is None else str(st_) if st_ in known else "other" for _, st_, _ in attempts
    )
    exposed = {
        sample.labels["code"]: sample.value
        for family in metrics.STATUS_CODES.collect()  # one read of the family, every code
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["source"] == source
    }
    assert {k: v for k, v in exposed.items() if v} == dict(twin)
    timed = sum(
        _value("collector_request_duration_seconds_count", source=source, status_class=k)
        for k in ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
    )
    assert timed == sum(1 for _, _, s in attempts if s is not None)
    assert _value("collector_retries_total", source=source, reason="timeout") == reasons.count(
        "timeout"
    )
    assert _value("http_client_retry_count_total", source=source, reason="timeout") == (
        reasons.count("timeout")
    )  # the seeds' name counts the same retries
    assert _value("collector_retry_budget_refusals_total", source=source) == reasons.count(
        "retry_budget"
    )


_WRITER = """
import sys
from collector.ops import metrics
from collector.deadletter import DeadLetter
n = int(sys.argv[1])
letters = [DeadLetter(source="multi", url=f"http://x/{i}", stage="fetch",
                      error_class="http_404", message="", attempts=1, first_seen=0.0,
                      last_seen=0.0) for i in range(n)]
metrics.count_dead_letters("multi", letters)
tally = metrics.RequestTally()
for _ in range(n):
    tally.request("h", 404, 0.01)
tally.flush("multi")
metrics.run_started("r", "multi", "run")
metrics.run_ended("r", "ok")
"""


def test_multiprocess_mode_sums_the_flow_run_processes(tmp_path: Path) -> None:
    """Two short-lived 'flow runs' write, exit; the summing server serves their sum."""
    folder = tmp_path / "multiproc"  # created by the first process that imports metrics
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_CLIENT_METRICS_ENABLED", None)
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", _WRITER, str(n)], env=env, check=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "collector.ops.metrics_server", "--port", str(port),
         "--addr", "127.0.0.1"],
        env=env, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
                    text = answer.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert server.stderr is not None  # started with stderr=PIPE
        assert text, server.stderr.read().decode() if server.poll() is not None else "no answer"
    finally:
        server.terminate()
        server.wait(timeout=10)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = (
        "collector_dead_letters_total",
        (("error_class", "http_404"), ("source", "multi"), ("stage", "fetch")),
    )
    assert samples[key] == 7  # 3 + 4, from two processes that are gone
    runs = ("collector_runs_total", (("result", "ok"), ("role", "run"), ("source", "multi")))
    assert samples[runs] == 2
    codes = ("http_client_status_code_count_total", (("code", "404"), ("source", "multi")))
    assert samples[codes] == 7  # the seeds' counter sums across processes too


def test_the_summing_server_refuses_to_start_without_a_folder() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run(
        [sys.executable, "-m", "collector.ops.metrics_server", "--port", "1"],
        env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "PROMETHEUS_MULTIPROC_DIR is not set" in done.stderr.strip().splitlines()[-1]


def _exposed_names() -> set[str]:
    """Every sample name collector.ops.metrics can expose (histogram and counter suffixes)."""
    names = set()
    for value in vars(metrics).values():
        kind = getattr(value, "_type", None)
        name = getattr(value, "_name", "")
        if not name.startswith(("collector_", "http_client_")):
            continue
        if kind == "counter":
            names |= {f"{name}_total"}
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
        else:
            names.add(name)
    return names


def test_dashboard_and_alerts_name_only_metrics_that_exist() -> None:
    exposed = _exposed_names()
    assert "collector_requests_total" in exposed and "collector_frontier_items" in exposed
    board = (ROOT / "infra" / "grafana" / "collector.json").read_text()
    alerts = yaml.safe_load((ROOT / "infra" / "prometheus" / "alerts.yaml").read_text())
    exprs = [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for group in alerts["groups"] for rule in group["rules"]
                if "record" in rule}  # fmt: skip
    used = set(re.findall(r"\b(?:collector|http_client)_[a-z_]+", board + "\n".join(exprs)))
    assert used - exposed - recorded == set()
    assert recorded == {"http_client_status_code_count"}
    seeds = {
        "collector_source_backlog_bytes", "http_client_retry_count_total",
        "http_client_status_code_count_total", "collector_frontier_claim_wait_seconds_bucket",
        "collector_host_slot_wait_seconds_bucket", "collector_source_lock_wait_seconds_bucket",
    }  # fmt: skip
    assert seeds <= used  # the dashboard shows the seeds' series
    fleet = {
        "collector_fleet_helpers", "collector_fleet_budget_helpers",
        "collector_fleet_claim_wait_seconds_bucket", "collector_fleet_helper_cpu_ratio",
        "collector_fleet_preemptions_total",
    }  # fmt: skip
    assert fleet <= used  # ...and the fleet's (docs/fleet.md)
    assert len(used) >= 20  # the dashboard covers the metric set
    assert re.findall(r"\bcollector_[a-z_]+", "collector_no_such_total") == [
        "collector_no_such_total"
    ]  # the pattern itself catches a wrong name
    json.loads(board)  # valid JSON


_SCRAPE = """
import sys, time, urllib.request
from collector.ops import metrics
from collector.deadletter import DeadLetter
from collector.frontier.base import StateCounts
from collector.ops.backlog import BacklogSettings
from collector.run.collection import BatchReport

metrics.enable()
tally = metrics.RequestTally()
for status in (200, 200, 404, 429, 503, 799, None):
    tally.request("a.example", status, 0.01 if status else None)
tally.retry("http_503")
tally.retry("retry_budget")
tally.slot_waited(0.003)
tally.flush("s", hosts=1)
metrics.claimed("s", 0.002, 1, ["http://a.example/1", "http://a.example/22"])
metrics.host_slots_waited("s", 0.2)
metrics.lock_waited("s", 0.004)
metrics.lease_renewed("s")
metrics.count_dead_letters("s", [DeadLetter(source="s", url="http://a.example/x", stage="fetch",
    error_class="http_404", message="", attempts=1, first_seen=0.0, last_seen=0.0)])
metrics.settled("s", seconds=0.1, report=BatchReport(token=1, items=2, validation_s=0.05,
    records_written=2, not_modified=3,
    stale_acks=1))


class Frontier:
    def counts(self, source):
        return StateCounts(queued=5, leased=2, done=3, dead=1, expired=1)


metrics.sample_frontier("s", Frontier(), BacklogSettings(), now=time.time(), force=True)
metrics.run_started("r", "s", "run")
metrics.run_ended("r", "ok")
server, thread = metrics.serve(int(sys.argv[1]), addr="127.0.0.1")
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10) as answer:
    sys.stdout.write(answer.read().decode())
server.shutdown()
"""


def test_promtool_check_metrics_accepts_a_real_scrape(tmp_path: Path) -> None:
    """Every series recorded once, served by metrics.serve, scraped over HTTP: promtool's
    linter (names, suffixes, units, HELP) accepts it, and the seeds' names are in it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("PROMETHEUS_MULTIPROC_DIR", "PREFECT_CLIENT_METRICS_ENABLED"):
        env.pop(name, None)
    scraped = subprocess.run(
        [sys.executable, "-c", _SCRAPE, str(free_port())], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert scraped.returncode == 0, scraped.stderr[-3000:]
    text = scraped.stdout
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                             text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    codes = {dict(k)["code"]: v for (n, k), v in samples.items()
             if n == "http_client_status_code_count_total"}  # fmt: skip
    assert codes == {"200": 2, "404": 1, "429": 1, "503": 1, "other": 1, "error": 1}
    assert (
        samples[("http_client_retry_count_total", (("reason", "http_503"), ("source", "s")))] == 1
    )
    # 5 + 2 + 1 backlog items x the mean bytes of the two claimed URLs (18 and 19)
    assert samples[("collector_source_backlog_bytes", (("source", "s"),))] == 8 * 18.5
    for wait in ("collector_frontier_claim_wait_seconds", "collector_source_lock_wait_seconds"):
        assert samples[(f"{wait}_count", (("source", "s"),))] == 1
        assert samples[(f"{wait}_bucket", (("le", "0.008"), ("source", "s")))] == 1
    for scope in ("engine", "shared"):
        key = ("collector_host_slot_wait_seconds_count", (("scope", scope), ("source", "s")))
        assert samples[key] == 1
    assert samples[("collector_pages_not_modified_total", (("source", "s"),))] == 3
    hosts = {dict(k)["host"] for (n, k) in samples if n == "collector_requests_total"}
    assert hosts == {"a.example"}  # opted in with hosts=1

    # The check can fail: a counter without its _total suffix is refused.
    bad = text.replace("collector_runs_total", "collector_runs")
    refused = subprocess.run([PROMTOOL, "check", "metrics"], input=bad, capture_output=True,
                             text=True)  # fmt: skip
    assert refused.returncode != 0


def test_a_metrics_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(tmp_path / "any.yaml"),
             "--metrics-port", str(port)],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
            cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"collector: --metrics-port {port}: cannot")


def test_host_labels_remember_only_the_named_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived worker sees hosts without end: those past the quota are `other` and are
    not kept, so the map stays at the quota whatever the number of hosts."""
    monkeypatch.setattr(metrics, "_hosts", {})
    monkeypatch.setattr(metrics, "_named", {})
    monkeypatch.setattr(metrics, "_max_hosts", 3)
    labels = [metrics.host_label("s", f"h{i}.example", named=5) for i in range(10_000)]
    assert labels[:3] == ["h0.example", "h1.example", "h2.example"]
    assert set(labels[3:]) == {"other"}
    assert len(metrics._hosts) == 3
    assert metrics.host_label("s", "h1.example", named=5) == "h1.example"  # still named
    assert [metrics.host_label("quiet", f"q{i}", named=0) for i in range(100)] == ["other"] * 100
    assert len(metrics._hosts) == 3
