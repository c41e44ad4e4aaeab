"""collector.ops.metrics: labels stay bounded, counts add up, off means off, and several
processes sum up in multiprocess mode (real processes, a real scrape, prometheus_client's own
parser). The end-to-end scrape by a real Prometheus is tests/test_metrics_end_to_end.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
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
    """Two hosts (127.0.0.1 and localhost) and a bound of 1: the second is `other`."""
    monkeypatch.setattr(metrics, "_hosts", {})
    monkeypatch.setattr(metrics, "_max_hosts", 1)
    source = f"bounded-{uuid.uuid4().hex[:8]}"
    port = site.base_url.rsplit(":", 1)[1]
    urls = [f"http://127.0.0.1:{port}/items/{i}.json" for i in range(3)]
    urls += [f"http://localhost:{port}/items/{i}.json" for i in range(2)]
    urls += [f"http://127.0.0.1:{port}/missing/1.json"]
    retry = RetrySettings(max_attempts=1)
    async with FetchEngine(
        retry=retry, host_policy=HostPolicy(allow_private_networks=True)
    ) as engine:
        assert engine.tally is not None
        results = await engine.fetch_batch(
            [_item(u) for u in urls], budget=RetryBudget(ratio=0.5, min_retries=0)
        )
        assert (
            _value("collector_requests_total", source=source, host="127.0.0.1", status_class="2xx")
            == 0
        )  # fmt: skip  (nothing until the flush)
        engine.tally.flush(source)
    assert [r.status for r in results] == ["ok"] * 5 + ["failed"]
    series = {
        (host, klass): _value(
            "collector_requests_total", source=source, host=host, status_class=klass
        )
        for host in ("127.0.0.1", "localhost", "other")
        for klass in ("2xx", "4xx")
    }
    assert series == {
        ("127.0.0.1", "2xx"): 3, ("127.0.0.1", "4xx"): 1,
        ("localhost", "2xx"): 0, ("localhost", "4xx"): 0,
        ("other", "2xx"): 2, ("other", "4xx"): 0,
    }  # fmt: skip
    assert _value("collector_request_duration_seconds_count", source=source,
                  status_class="2xx") == 5  # fmt: skip
    assert engine.tally.requests == {}  # flushed: a second flush adds nothing


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
        st.one_of(st.none(), st.integers(100, 599)),
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
        _value(
            "collector_requests_total", source=source, host=metrics.host_label(h), status_class=k
        )
        for h in ("a.example", "b.example")
        for k in ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
    )
    assert total == len(attempts)
    timed = sum(
        _value("collector_request_duration_seconds_count", source=source, status_class=k)
        for k in ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
    )
    assert timed == sum(1 for _, _, s in attempts if s is not None)
    assert _value("collector_retries_total", source=source, reason="timeout") == reasons.count(
        "timeout"
    )
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
        if not name.startswith("collector_"):
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
    used = set(re.findall(r"\bcollector_[a-z_]+", board + "\n".join(exprs)))
    assert used - exposed == set()
    assert len(used) >= 15  # the dashboard covers the metric set
    assert re.findall(r"\bcollector_[a-z_]+", "collector_no_such_total") == [
        "collector_no_such_total"
    ]  # the pattern itself catches a wrong name
    json.loads(board)  # valid JSON


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
