"""Prometheus metrics of Collector, in ``prometheus_client``'s default registry.

Why the default registry: Prefect already depends on ``prometheus_client`` and serves that
registry from every worker or flow-run process when ``PREFECT_CLIENT_METRICS_ENABLED`` is on
(port ``PREFECT_CLIENT_METRICS_PORT``), so Collector's series appear beside Prefect's own on the
same endpoint, with no second server. ``collector run|work --metrics-port N`` turns exactly that
on for a local run.

Per process, not per run, on purpose: the registry and the endpoint that serves it are the
process's (Prefect's client metrics server, the multiprocess directory), so whether this
process records is one switch beside them, not a run's setting.

Off unless asked for. Recording starts when :func:`enable` is called (the CLI's
``--metrics-port``, the collect flow when Prefect's client metrics are on) or when
``PREFECT_CLIENT_METRICS_ENABLED`` or ``PROMETHEUS_MULTIPROC_DIR`` is in the environment; until
then every helper returns at once and the fetch engine keeps no tally.

Cost: nothing is recorded per request in Prometheus itself. The engine counts requests into a
plain :class:`RequestTally` (a dict increment and a list append per attempt) and the run flushes
it once per batch; labelled children are cached per source.

Labels are bounded: ``source`` (configured), ``status_class`` (``2xx``..``5xx``, ``error``),
``code`` (an exact HTTP status of :class:`http.HTTPStatus`, ``other`` for an unregistered one,
``error`` when no response came), ``stage`` and ``error_class`` / ``reason`` (the fixed error
classes of collector.errors and collector.policy.retry), ``state``/``outcome``/``kind``/``scope``
(fixed sets). ``host`` is ``other`` unless the source opts in (``metrics.hosts: N``): then its
first N hosts this process sees are named, at most ``COLLECTOR_METRICS_MAX_HOSTS`` (default 20),
and the rest stay ``other``. Never a URL or a record key.

The seeds' names (the two systems Collector rebuilds; their dashboards and alerts port by name):
``http_client_status_code_count`` (family of ``..._total{code}``), ``http_client_retry_count``
(``..._total``, the same retries as ``collector_retries_total``) and
``collector_source_backlog_bytes``; their lock benchmark's "wait" is the three
``*_wait_seconds`` histograms (source lock, frontier claim, per-host slot), bucketed finely
enough below 10 ms to read a p99 against "lock wait P99 <= 8 ms".

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
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from collector import defaults

if TYPE_CHECKING:
    from collector.deadletter import DeadLetter
    from collector.frontier.base import Frontier, StateCounts
    from collector.ops.backlog import BacklogSettings, Level, Sample
    from collector.run.summary import BatchReport

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
# Lock-grade waits: fine below 10 ms (the seeds' "lock wait P99 <= 8 ms" needs an 8 ms bound),
# long enough above for a source lock held by a whole run.
_LOCK_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.008, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 30, 60,
    120, 300, 600,
)  # fmt: skip
_SHORT_LOCK_BUCKETS = _LOCK_BUCKETS[:14]  # up to 5 s: a claim, a host's slot

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
STATUS_CODES = Counter(
    "http_client_status_code_count",
    "HTTP attempts by exact status code (the seeds' name; code 'error' = no response, 'other' = "
    "a status outside http.HTTPStatus).",
    ["source", "code"],
)
RETRIES = Counter(
    "collector_retries_total",
    "Retries decided (waited inside the batch or deferred to the frontier), by error class.",
    ["source", "reason"],
)
HTTP_RETRIES = Counter(
    "http_client_retry_count",
    "The seeds' name of collector_retries_total: retries decided, by error class.",
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
PAGES_NOT_MODIFIED = Counter(
    "collector_pages_not_modified_total",
    "Pages fetched again with their validators and answered 304 Not Modified: fresh again "
    "with nothing parsed, validated or written (collector.fetch.conditional).",
    ["source"],
)
CLAIM_SECONDS = Histogram(
    "collector_claim_duration_seconds",
    "Time of one frontier claim (expire, reclaim, fence, lease).",
    ["source"],
    buckets=_STEP_BUCKETS,
)
CLAIM_WAIT_SECONDS = Histogram(
    "collector_frontier_claim_wait_seconds",
    "Time from asking the frontier for a batch to holding its lease (the store's lock or "
    "transaction included), in lock-grade buckets.",
    ["source"],
    buckets=_SHORT_LOCK_BUCKETS,
)
HOST_SLOT_WAIT_SECONDS = Histogram(
    "collector_host_slot_wait_seconds",
    "Time waited for a per-host slot: scope 'engine' = one request for its host's window in "
    "the fetch engine (pacing included), 'shared' = one batch for its domain:<host> slots.",
    ["source", "scope"],
    buckets=_LOCK_BUCKETS,
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
BACKLOG_BYTES = Gauge(
    "collector_source_backlog_bytes",
    "The seeds' backlog in bytes: backlog items (queued + leased + expired) x the mean UTF-8 "
    "bytes of the URLs this process claimed for the source (an estimate; 0 before a claim).",
    ["source"],
    multiprocess_mode="mostrecent",
)
LOCK_WAIT_SECONDS = Histogram(
    "collector_source_lock_wait_seconds",
    "Time a run waited for its source:<name> lock (acquired or given up).",
    ["source"],
    buckets=_LOCK_BUCKETS,
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
FLEET_CLAIM_WAIT = Histogram(
    "collector_fleet_claim_wait_seconds",
    "Claim wait of a deployed source as the fleet autoscaler estimates it at each decision "
    "(due items / claim rate over 100 ms frontier samples; +Inf: due items and no claims).",
    ["source"],
    buckets=_LOCK_BUCKETS,
)
FLEET_HELPERS = Gauge(
    "collector_fleet_helpers",
    "`collector work` helper runs of the source the fleet autoscaler counts (stopping included).",
    ["source"],
    multiprocess_mode="mostrecent",
)
FLEET_HELPER_CPU = Gauge(
    "collector_fleet_helper_cpu_ratio",
    "Mean CPU share of the source's running helpers, from their own reports (process CPU "
    "seconds / wall seconds; 1 = one core).",
    ["source"],
    multiprocess_mode="mostrecent",
)
FLEET_BUDGET = Gauge(
    "collector_fleet_budget_helpers",
    "The fleet's helper budget (kind=budget) and the helpers running against it (kind=used).",
    ["kind"],
    multiprocess_mode="mostrecent",
)
FLEET_PREEMPTIONS = Counter(
    "collector_fleet_preemptions_total",
    "Helpers of the source the fleet stopped so a higher class could have their slot.",
    ["source"],
)

_LEVEL_VALUE = {"ok": 0, "warning": 1, "critical": 2}
_STATES = ("queued", "leased", "done", "dead", "expired")

_CODES = frozenset(str(int(status)) for status in HTTPStatus)

_enabled: bool | None = None  # None: not decided yet (read the environment once)
_lock = threading.Lock()
# Process-wide on purpose: Prometheus series live as long as the process, so their labels must
# too. Each map is bounded: the named hosts by COLLECTOR_METRICS_MAX_HOSTS per source, the rest
# by the sources this process runs (one entry each).
_hosts: dict[tuple[str, str], str] = {}  # (source, host) -> its label, named hosts only
_named: dict[str, int] = {}  # source -> hosts named so far
_max_hosts: int | None = None
_url_bytes: dict[str, list[int]] = {}  # source -> [URL bytes claimed, URLs claimed]
_sampled_at: dict[str, float] = {}
_levels: dict[str, Level] = {}
_samples: dict[str, list[Sample]] = {}  # recent backlog samples per source (the trend)


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


def status_code(status: int | None) -> str:
    """The ``code`` label: the exact status when :class:`http.HTTPStatus` knows it, ``other``
    for any other number, ``error`` when no response came (a bounded set of about 65)."""
    if status is None:
        return "error"
    code = str(status)
    return code if code in _CODES else "other"


def host_label(source: str, host: str, named: int = 0) -> str:
    """``host`` for the first ``named`` hosts of ``source`` this process sees (at most
    ``COLLECTOR_METRICS_MAX_HOSTS``), ``other`` for the rest: with ``named`` 0 (a source that
    did not opt in) every host is ``other``, so hosts never become series by default.

    Only the named hosts are remembered: a long-lived worker that sees millions of hosts keeps
    at most ``COLLECTOR_METRICS_MAX_HOSTS`` per source, since every host seen after the quota
    is full is ``other`` anyway."""
    label = _hosts.get((source, host))
    if label is not None:
        return label
    with _lock:
        count = _named.get(source, 0)
        if count >= min(named, _host_quota()):
            return "other"
        _named[source] = count + 1
        _hosts[(source, host)] = host
    return host


def _host_quota() -> int:
    global _max_hosts
    if _max_hosts is None:
        raw = os.environ.get("COLLECTOR_METRICS_MAX_HOSTS", "")
        _max_hosts = int(raw) if raw.strip().isdigit() else defaults.METRICS_MAX_HOSTS
    return _max_hosts


class RequestTally:
    """What one batch's requests did, counted in plain dicts on the engine's hot path.

    :meth:`flush` moves it into Prometheus once per batch, so a request costs a dict
    increment and a list append, not a labelled-metric lookup and a lock.
    """

    __slots__ = ("durations", "refused", "requests", "retries", "slot_waits")

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int | None], int] = {}
        self.durations: list[tuple[int | None, float]] = []
        self.retries: dict[str, int] = {}
        self.slot_waits: list[float] = []
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

    def slot_waited(self, seconds: float) -> None:
        """One request waited ``seconds`` for its host's slot in the engine."""
        self.slot_waits.append(seconds)

    def flush(self, source: str, *, hosts: int = 0) -> None:
        """Add what was counted to the source's series and start again from zero.

        ``hosts``: how many hosts the source lets the ``host`` label name (its
        ``metrics.hosts``; 0 = none, every host is ``other``)."""
        requests, durations, retries, refused, slot_waits = (
            self.requests,
            self.durations,
            self.retries,
            self.refused,
            self.slot_waits,
        )
        self.requests, self.durations, self.retries, self.refused = {}, [], {}, 0
        self.slot_waits = []
        if not enabled():
            return
        codes: dict[str, int] = {}
        for (host, status), count in requests.items():
            label = host_label(source, host, hosts)
            REQUESTS.labels(source, label, status_class(status)).inc(count)
            code = status_code(status)
            codes[code] = codes.get(code, 0) + count
        for code, count in codes.items():
            STATUS_CODES.labels(source, code).inc(count)
        if slot_waits:
            slot = HOST_SLOT_WAIT_SECONDS.labels(source, "engine")
            for seconds in slot_waits:
                slot.observe(seconds)
        children: dict[str, Any] = {}
        for status, seconds in durations:
            klass = status_class(status)
            child = children.get(klass)
            if child is None:
                child = children[klass] = REQUEST_SECONDS.labels(source, klass)
            child.observe(seconds)
        for reason, count in retries.items():
            RETRIES.labels(source, reason).inc(count)
            HTTP_RETRIES.labels(source, reason).inc(count)
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


def claimed(source: str, seconds: float, reclaimed: int, urls: Iterable[str] = ()) -> None:
    """One claim took ``seconds`` and returned ``reclaimed`` items of expired leases; ``urls``
    (the batch's) feed the mean URL size behind ``collector_source_backlog_bytes``."""
    if not enabled():
        return
    CLAIM_SECONDS.labels(source).observe(seconds)
    CLAIM_WAIT_SECONDS.labels(source).observe(seconds)
    if reclaimed:
        LEASES_RECLAIMED.labels(source).inc(reclaimed)
    sizes = _url_bytes.setdefault(source, [0, 0])
    for url in urls:
        sizes[0] += len(url.encode("utf-8", "replace"))
        sizes[1] += 1


def host_slots_waited(source: str, seconds: float) -> None:
    """A batch waited ``seconds`` for its shared ``domain:<host>`` slots."""
    if enabled():
        HOST_SLOT_WAIT_SECONDS.labels(source, "shared").observe(seconds)


def backlog_bytes(source: str, depth: int) -> float:
    """``depth`` backlog items x the mean URL bytes claimed for ``source`` (0 before a claim)."""
    total, count = _url_bytes.get(source, (0, 0))
    return depth * total / count if count else 0.0


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
    if report.not_modified:
        PAGES_NOT_MODIFIED.labels(source).inc(report.not_modified)
    if report.stale_writes:
        FENCE_REFUSALS.labels(source, "write").inc(report.stale_writes)
    if report.stale_acks:
        FENCE_REFUSALS.labels(source, "ack").inc(report.stale_acks)


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
    from collector.ops.backlog import level_after, sample_of

    counts = frontier.counts(source)
    for state in _STATES:
        FRONTIER_ITEMS.labels(source, state).set(getattr(counts, state))
    sample = sample_of(counts, backlog, now=now)
    earlier = _samples.get(source, [])
    level = level_after(
        _levels.get(source, "ok"), earlier, sample, backlog.thresholds, backlog.trend_s
    )
    _levels[source] = level
    # keep what the trend needs: the samples of the last trend_s, and the newest one before
    older = [s for s in earlier if now - s.at >= backlog.trend_s][-1:]
    _samples[source] = [*older, *(s for s in earlier if now - s.at < backlog.trend_s), sample]
    BACKLOG_RATIO.labels(source).set(sample.ratio)
    BACKLOG_BYTES.labels(source).set(backlog_bytes(source, sample.depth))
    BACKLOG_LEVEL.labels(source).set(_LEVEL_VALUE[level])
    return counts


def fleet_sampled(source: str, wait_s: float, helpers: int, cpu: float | None = None) -> None:
    """One fleet decision saw ``source`` with this claim wait, this many helpers and their
    mean CPU share (None: no helper reported one; the gauge keeps its last value)."""
    if enabled():
        FLEET_CLAIM_WAIT.labels(source).observe(wait_s)
        FLEET_HELPERS.labels(source).set(helpers)
        if cpu is not None:
            FLEET_HELPER_CPU.labels(source).set(cpu)


def fleet_budget(budget: int, used: int) -> None:
    if enabled():
        FLEET_BUDGET.labels("budget").set(budget)
        FLEET_BUDGET.labels("used").set(used)


def fleet_preempted(source: str, count: int = 1) -> None:
    if enabled():
        FLEET_PREEMPTIONS.labels(source).inc(count)


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


# Process-wide with the series it counts into; bounded: past RUNS_KEPT runs not ended, the oldest
# is forgotten (a run whose end no hook saw; its end, should it come, is then not counted).
RUNS_KEPT = 1_024
_runs: dict[
    str, tuple[str, str]
] = {}  # run id -> (source, role) of runs not ended yet, oldest first


def run_started(run_id: str, source: str, role: str) -> None:
    """Remember a run so that :func:`run_ended` can count it by source and role.

    Its ``collector_runs_total`` series start at 0 now, so ``increase()`` sees the first end.
    """
    _runs[run_id] = (source, role)
    while len(_runs) > RUNS_KEPT:
        del _runs[next(iter(_runs))]
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
