"""Prometheus metrics of Collector, in ``prometheus_client``'s default registry.

Why the default registry: Prefect already depends on ``prometheus_client`` and serves that
registry from every worker or flow-run process when ``PREFECT_CLIENT_METRICS_ENABLED`` is on
(port ``PREFECT_CLIENT_METRICS_PORT``), so Collector's series appear beside Prefect's own on the
same endpoint, with no second server. ``collector run|work --metrics-port N`` turns exactly that
on for a local run.

Off unless asked for. Recording starts when :func:`enable` is called (the CLI's
``--metrics-port``, the collect flow when Prefect's client metrics are on) or when
``PREFECT_CLIENT_METRICS_ENABLED`` or ``PROMETHEUS_MULTIPROC_DIR`` is in the environment; until
then every helper returns at once and the fetch engine keeps no tally.

Cost: nothing is recorded per request in Prometheus itself. The engine counts requests into a
plain :class:`RequestTally` (a dict increment and a list append per attempt) and the run flushes
it once per batch; labelled children are cached per source.

Labels are bounded: ``source`` (configured), ``status_class`` (``2xx``..``5xx``, ``error``),
``stage`` and ``error_class`` / ``reason`` (the fixed error classes of collector.errors and
collector.policy.retry), ``state``/``outcome``/``kind`` (fixed sets). ``host`` keeps the first
``COLLECTOR_METRICS_MAX_HOSTS`` (default 20) hosts a process sees and calls the rest ``other``.
Never a URL or a record key.

Several processes: counters are process-cumulative and labelled by source, which is what
Prometheus' ``rate()`` expects (a restart is a counter reset it handles). A long-lived
``collector run``/``collector work`` process serves its own. A Prefect *process* worker starts
one short-lived process per flow run, whose counters would die with it: there, set
``PROMETHEUS_MULTIPROC_DIR`` on the worker (inherited by its flow-run processes, which then
write their values to files in it) and serve the sum with ``python -m
collector.ops.metrics_server --port N`` beside the worker (prometheus_client's multiprocess
mode; gauges keep the most recent value written by any process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from collector import defaults

if TYPE_CHECKING:
    from collector.deadletter import DeadLetter
    from collector.frontier.base import Frontier, StateCounts
    from collector.ops.backlog import BacklogSettings, Level
    from collector.run.collection import BatchReport

__all__ = [
    "RequestTally",
    "count_dead_letters",
    "enable",
    "enabled",
    "serve",
]

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # flow runs may start before the summing server
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600)

REQUESTS = Counter(
    "collector_requests_total",
    "HTTP attempts sent, by source, host (bounded, see COLLECTOR_METRICS_MAX_HOSTS) and status "
    "class (2xx..5xx, error = no HTTP response).",
    ["source", "host", "status_class"],
)
REQUEST_SECONDS = Histogram(
    "collector_request_duration_seconds",
    "Time of one HTTP attempt, from sending to the whole body read (or the failure).",
    ["source", "status_class"],
    buckets=_LATENCY_BUCKETS,
)
RETRIES = Counter(
    "collector_retries_total",
    "Retries decided (waited inside the batch or deferred to the frontier), by error class.",
    ["source", "reason"],
)
RETRY_BUDGET_REFUSALS = Counter(
    "collector_retry_budget_refusals_total",
    "Retries the run's retry budget refused (the item waits in the frontier instead).",
    ["source"],
)
DEAD_LETTERS = Counter(
    "collector_dead_letters_total",
    "Dead letters written, by stage (plan, fetch, parse, validate) and error class.",
    ["source", "stage", "error_class"],
)
RECORDS = Counter(
    "collector_records_total",
    "Records settled: written (new or changed), unchanged (same content), quarantined.",
    ["source", "outcome"],
)
CLAIM_SECONDS = Histogram(
    "collector_claim_duration_seconds",
    "Time of one frontier claim (expire, reclaim, fence, lease).",
    ["source"],
    buckets=_STEP_BUCKETS,
)
SETTLE_SECONDS = Histogram(
    "collector_settle_duration_seconds",
    "Time from a fetched batch to its ack (parse, validation, the wait for the batch before, "
    "sink write, dead letters, ack).",
    ["source"],
    buckets=_STEP_BUCKETS,
)
VALIDATION_SECONDS = Histogram(
    "collector_validation_duration_seconds",
    "Great Expectations time of one batch, measured in the validation worker.",
    ["source"],
    buckets=_STEP_BUCKETS,
)
LEASE_RENEWALS = Counter(
    "collector_lease_renewals_total", "Batch lease renewals (every lease_s / 3).", ["source"]
)
LEASES_RECLAIMED = Counter(
    "collector_leases_reclaimed_total",
    "Items whose expired lease a claim returned to the queue (a holder died or stalled).",
    ["source"],
)
FENCE_REFUSALS = Counter(
    "collector_fence_refusals_total",
    "Writes (sink records) and acks (frontier items) refused by a fencing token: a newer lease "
    "holds them.",
    ["source", "kind"],
)
FRONTIER_ITEMS = Gauge(
    "collector_frontier_items",
    "Items of the source in the frontier per state, sampled by running collect processes.",
    ["source", "state"],
    multiprocess_mode="mostrecent",
)
BACKLOG_RATIO = Gauge(
    "collector_backlog_ratio",
    "Backlog depth (queued + leased + expired) over capacity, sampled with the frontier.",
    ["source"],
    multiprocess_mode="mostrecent",
)
BACKLOG_LEVEL = Gauge(
    "collector_backlog_level",
    "Backlog level with hysteresis: 0 ok, 1 warning, 2 critical (this process's view).",
    ["source"],
    multiprocess_mode="mostrecent",
)
LOCK_WAIT_SECONDS = Histogram(
    "collector_source_lock_wait_seconds",
    "Time a run waited for its source:<name> lock (acquired or given up).",
    ["source"],
    buckets=_WAIT_BUCKETS,
)
RUNS = Counter(
    "collector_runs_total",
    "Collect runs ended, by role (run, work) and result (ok, failed, cancelled, skipped).",
    ["source", "role", "result"],
)
LAST_SUCCESS = Gauge(
    "collector_last_success_timestamp_seconds",
    "UNIX time of the last collect run of the source that ended balanced.",
    ["source"],
    multiprocess_mode="mostrecent",
)

_LEVEL_VALUE = {"ok": 0, "warning": 1, "critical": 2}
_STATES = ("queued", "leased", "done", "dead", "expired")

_enabled: bool | None = None  # None: not decided yet (read the environment once)
_lock = threading.Lock()
_hosts: dict[str, str] = {}
_max_hosts: int | None = None
_sampled_at: dict[str, float] = {}
_levels: dict[str, Level] = {}


def enable(on: bool = True) -> None:
    """Record metrics in this process from now on (or stop, with ``on=False``)."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    """True when this process records metrics (see the module docstring for what turns it on)."""
    global _enabled
    if _enabled is None:
        flag = os.environ.get("PREFECT_CLIENT_METRICS_ENABLED", "").strip().lower()
        _enabled = flag in {"1", "true", "yes", "on"} or bool(
            os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        )
    return _enabled


def status_class(status: int | None) -> str:
    """``2xx``..``5xx`` for an HTTP status, ``error`` when no response came (timeout, reset)."""
    if status is None or not 100 <= status < 600:
        return "error"
    return f"{status // 100}xx"


def host_label(host: str) -> str:
    """``host`` for the first N hosts this process sees, ``other`` after (bounded series)."""
    global _max_hosts
    label = _hosts.get(host)
    if label is not None:
        return label
    with _lock:
        if _max_hosts is None:
            raw = os.environ.get("COLLECTOR_METRICS_MAX_HOSTS", "")
            _max_hosts = int(raw) if raw.strip().isdigit() else defaults.METRICS_MAX_HOSTS
        label = host if len(_hosts) < _max_hosts else "other"
        _hosts[host] = label
    return label


class RequestTally:
    """What one batch's requests did, counted in plain dicts on the engine's hot path.

    :meth:`flush` moves it into Prometheus once per batch, so a request costs a dict
    increment and a list append, not a labelled-metric lookup and a lock.
    """

    __slots__ = ("durations", "refused", "requests", "retries")

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int | None], int] = {}
        self.durations: list[tuple[int | None, float]] = []
        self.retries: dict[str, int] = {}
        self.refused = 0

    def request(self, host: str, status: int | None, seconds: float | None) -> None:
        """One attempt: ``status`` None when no response came; ``seconds`` None when unknown
        (an attempt cut off by the batch deadline)."""
        key = (host, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        if seconds is not None:
            self.durations.append((status, seconds))

    def retry(self, reason: str) -> None:
        """A retry decided for ``reason``; ``retry_budget`` counts as a budget refusal."""
        if reason == "retry_budget":
            self.refused += 1
        else:
            self.retries[reason] = self.retries.get(reason, 0) + 1

    def flush(self, source: str) -> None:
        """Add what was counted to the source's series and start again from zero."""
        requests, durations, retries, refused = (
            self.requests,
            self.durations,
            self.retries,
            self.refused,
        )
        self.requests, self.durations, self.retries, self.refused = {}, [], {}, 0
        if not enabled():
            return
        for (host, status), count in requests.items():
            REQUESTS.labels(source, host_label(host), status_class(status)).inc(count)
        children: dict[str, Any] = {}
        for status, seconds in durations:
            klass = status_class(status)
            child = children.get(klass)
            if child is None:
                child = children[klass] = REQUEST_SECONDS.labels(source, klass)
            child.observe(seconds)
        for reason, count in retries.items():
            RETRIES.labels(source, reason).inc(count)
        if refused:
            RETRY_BUDGET_REFUSALS.labels(source).inc(refused)


def count_dead_letters(source: str, letters: Iterable[DeadLetter]) -> None:
    """Count dead letters per ``(stage, error_class)``."""
    if not enabled():
        return
    counts: dict[tuple[str, str], int] = {}
    for letter in letters:
        key = (letter.stage, letter.error_class)
        counts[key] = counts.get(key, 0) + 1
    for (stage, error_class), count in counts.items():
        DEAD_LETTERS.labels(source, stage, error_class).inc(count)


def claimed(source: str, seconds: float, reclaimed: int) -> None:
    """One claim took ``seconds`` and returned ``reclaimed`` items of expired leases."""
    if not enabled():
        return
    CLAIM_SECONDS.labels(source).observe(seconds)
    if reclaimed:
        LEASES_RECLAIMED.labels(source).inc(reclaimed)


def lease_renewed(source: str) -> None:
    if enabled():
        LEASE_RENEWALS.labels(source).inc()


def settled(source: str, *, seconds: float, report: BatchReport) -> None:
    """One batch settled in ``seconds``: its GX time, records' outcomes and fence refusals."""
    if not enabled():
        return
    SETTLE_SECONDS.labels(source).observe(seconds)
    if report.validation_s:
        VALIDATION_SECONDS.labels(source).observe(report.validation_s)
    for outcome, count in (
        ("written", report.records_written),
        ("unchanged", report.records_unchanged),
        ("quarantined", report.records_quarantined),
    ):
        if count:
            RECORDS.labels(source, outcome).inc(count)
    if report.stale_writes:
        FENCE_REFUSALS.labels(source, "write").inc(report.stale_writes)
    if report.stale:
        FENCE_REFUSALS.labels(source, "ack").inc(report.stale)


def sample_frontier(
    source: str,
    frontier: Frontier,
    backlog: BacklogSettings,
    *,
    now: float,
    force: bool = False,
) -> StateCounts | None:
    """Set the frontier-depth and backlog gauges, at most every ``METRICS_SAMPLE_S``.

    Returns the counts read, or None when it was not time yet (or metrics are off).
    """
    if not enabled():
        return None
    if not force and now - _sampled_at.get(source, -1e18) < defaults.METRICS_SAMPLE_S:
        return None
    _sampled_at[source] = now
    from collector.ops.backlog import next_level, sample_of

    counts = frontier.counts(source)
    for state in _STATES:
        FRONTIER_ITEMS.labels(source, state).set(getattr(counts, state))
    sample = sample_of(counts, backlog, now=now)
    level = next_level(_levels.get(source, "ok"), sample.ratio, backlog.thresholds)
    _levels[source] = level
    BACKLOG_RATIO.labels(source).set(sample.ratio)
    BACKLOG_LEVEL.labels(source).set(_LEVEL_VALUE[level])
    return counts


def lock_waited(source: str, seconds: float) -> None:
    if enabled():
        LOCK_WAIT_SECONDS.labels(source).observe(seconds)


class TimedLock:
    """Wraps an async lock context manager; how long entering it took goes to
    ``collector_source_lock_wait_seconds``."""

    def __init__(self, lock: AbstractAsyncContextManager[Any], source: str) -> None:
        self.lock = lock
        self.source = source

    async def __aenter__(self) -> Any:
        began = time.monotonic()
        try:
            return await self.lock.__aenter__()
        finally:
            lock_waited(self.source, time.monotonic() - began)

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self.lock.__aexit__(*exc_info)


_runs: dict[str, tuple[str, str]] = {}  # run id -> (source, role) of runs not ended yet


def run_started(run_id: str, source: str, role: str) -> None:
    """Remember a run so that :func:`run_ended` can count it by source and role.

    Its ``collector_runs_total`` series start at 0 now, so ``increase()`` sees the first end.
    """
    _runs[run_id] = (source, role)
    if enabled():
        for result in ("ok", "failed", "cancelled", "skipped"):
            RUNS.labels(source, role, result)


def result_of(balanced: bool, interrupted: str | None) -> str:
    """A run's ``result`` label: ``cancelled`` (stopped by a signal), else ``ok`` when its
    ledger balanced, else ``failed``."""
    if interrupted:
        return "cancelled"
    return "ok" if balanced else "failed"


def run_ended(run_id: str, result: str) -> None:
    """The run ended with ``result`` (see :func:`result_of`, or ``skipped``); once per run,
    so the failure hook may call it again after the flow itself did."""
    started = _runs.pop(run_id, None)
    if started is None or not enabled():
        return
    source, role = started
    RUNS.labels(source, role, result).inc()
    if result == "ok":
        LAST_SUCCESS.labels(source).set(time.time())


def serve(port: int, *, addr: str = "0.0.0.0") -> Any:
    """Serve the metrics on ``port``: the sum over processes in multiprocess mode, else this
    process's default registry. Returns prometheus_client's (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return start_http_server(port, addr=addr, registry=registry)
    enable()
    return start_http_server(port, addr=addr)
