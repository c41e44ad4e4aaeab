"""Every default in one place, each with its meaning and unit.

Source files override these per source; nothing else in the engine hard-codes a number that a
user might want to change.
"""

from __future__ import annotations

from typing import Literal

# --- TTL (seconds) -------------------------------------------------------------------------
DEFAULT_FRESH_S = 3600.0  # a fetched URL is skipped by planning for this long
# ttl.revisit: adaptive keeps each page's learned interval within these (seconds)
MIN_FRESH_S = 600.0
MAX_FRESH_S = 30 * 86_400.0
QUEUE_TTL_S = 6 * 3600.0  # a job queued (or waiting to retry) longer than this is expired
HTTP_TIMEOUT_S = 10.0  # httpx connect/read/write/pool timeout of one request
REQUEST_DEADLINE_S = 15.0  # hard wall-clock deadline of one request attempt (really cancels)
BATCH_TIMEOUT_S = 300.0  # Prefect task timeout_seconds of one fetch batch
LEASE_S = 600.0  # a claim lives this long without renewal; renewed every LEASE_S / 3

# --- Priority ------------------------------------------------------------------------------
PRIORITY_WEIGHT = 5  # 1 (least) .. 10 (most important)
# run class -> Prefect work queue priority: critical 1, high 2, normal 3, low 4
PRIORITY_CLASS: Literal["critical", "high", "normal", "low"] = "normal"
AGING_PER_MINUTE = 1.0  # score points gained per minute of waiting (anti-starvation)
RETRY_PENALTY = 0.7  # score multiplier per failed attempt
COST_FACTOR = 0.02  # score divisor term per unit of cost: 1 / (1 + COST_FACTOR * cost)

# --- Retry ---------------------------------------------------------------------------------
RETRY_PROFILE: Literal["exponential", "linear"] = "exponential"  # exponential | linear
RETRY_BASE_S = 0.5  # first backoff ceiling; full jitter draws from [0, ceiling)
RETRY_CAP_S = 30.0  # no single backoff ceiling exceeds this
MAX_ATTEMPTS = 4  # initial request + 3 retries, counted across runs
MAX_TOTAL_S = 900.0  # no retry is scheduled later than this after the first attempt
RETRY_BUDGET_RATIO = 0.2  # retries may be at most this share of all requests of a run...
RETRY_BUDGET_MIN = 20  # ...but this many retries are always allowed (small runs)
MAX_INLINE_DELAY_S = 2.0  # a backoff up to this long is waited inside the batch; longer ones
#                           go back to the frontier with a not-before time
MAX_RETRY_AFTER_S = 3600.0  # a larger Retry-After is clamped to this
RETRY_MULTIPLIER = 2.0  # exponential growth of the backoff ceiling per retry
RETRY_JITTER: Literal["full", "proportional", "none"] = "full"  # full: uniform [0, ceiling)
RETRY_BUDGET_WINDOW_S = 1.0  # the time budget counts inline retry waits over this window
DEGRADE_SHARE = 1.0  # share of a 429-answering host's requests sent (1 = all: off)
DEGRADE_HOLD_S = 5.0  # a host counts as answering 429 this long after its last 429

# --- Limits --------------------------------------------------------------------------------
CONCURRENCY = 32  # requests in flight per worker
PER_DOMAIN_CONCURRENCY = 32  # requests in flight per host per worker
MAX_RESPONSE_BYTES = 10 * 1024 * 1024  # a larger body is refused (permanent error)
MAX_REDIRECTS = 5  # redirects followed per request
TRANSPORT = "aiohttp"  # connection pool under httpx: aiohttp's (fast) or httpx's own
CONNECTIONS_PER_CLIENT = 2  # httpx's own pool degrades with many connections per client
#                             several small clients (see docs/architecture.md, measurements)
USER_AGENT = "collector/0.1 (+https://github.com/collector)"

# --- Circuit breaker, per host (see docs/politeness.md) ------------------------------------
CIRCUIT_FAILURES = 5  # consecutive recoverable failures (connect, timeout, 5xx, 429) that open it
CIRCUIT_FAILURE_RATIO = 0.5  # ...or this share of failures among the last CIRCUIT_WINDOW responses
CIRCUIT_WINDOW = 20  # responses the ratio looks at (it applies once this many were seen)
CIRCUIT_COOLDOWN_S = 5.0  # the first opening lasts this long; probes go through after it
CIRCUIT_COOLDOWN_FACTOR = 2.0  # each re-opening (a failed probe) multiplies the cool-down by this
CIRCUIT_COOLDOWN_MAX_S = 300.0  # ...up to this
CIRCUIT_JITTER = 0.2  # cool-downs are drawn from +-20 % around their value (workers spread out)
CIRCUIT_PROBES = 2  # requests let through at once while half-open; one success closes it
CIRCUIT_SYNC_S = 0.1  # a worker re-reads a shared (Redis) breaker at most this often per host

# --- Adaptive concurrency, per host (AIMD on a window, see docs/politeness.md) ---------------
ADAPTIVE_START = 4  # a host's window starts here and grows while it answers fast
ADAPTIVE_LATENCY_FACTOR = 2.0  # latency above floor x this (and floor + margin) shrinks it
ADAPTIVE_LATENCY_MARGIN_S = 0.025  # ...so sub-millisecond jitter of a fast host never counts
ADAPTIVE_DECREASE = 0.5  # window x this on timeouts, refused connections, 502, 504
ADAPTIVE_LATENCY_DECREASE = 0.75  # window x this when only the latency rose
ADAPTIVE_RATE_FLOOR = 1.0  # requests/s: 429/503s never pace a host below this unless it keeps
#                            throttling at this rate (collector.fetch.pacing)

# --- Run -----------------------------------------------------------------------------------
FETCH_AHEAD = 2  # batches a run fetches at once: the next is claimed once every request of the
#                 current one has started, so request slots stay busy through a batch's tail
#                 (collector.run.drain says why no deadline can be missed); 1: one at a time
SETTLE_BACKLOG = 8  # fetched batches that may wait for settling (validation, sink, ack) while
#                    the next ones are fetched; bounds memory at SETTLE_BACKLOG x BATCH_SIZE bodies
PROGRESS_EVERY_S = 2.0  # the UI progress artifact is updated at most this often
BATCH_SIZE = 200  # items claimed, fetched and stored per Prefect task
DRAIN_WAIT_S = 60.0  # a run waits this long for retry-later items and others' leases to return
LOCAL_SERVER_IDLE_S = 1800.0  # the background Prefect server of `collector` stops after this long
#                              without use and without active flow runs (flows/local_server.py)
STATE_DIR = ".collector"  # frontier and dead letters live here, beside the source file
VALIDATION_LINGER_S = 5.0  # a fetched batch waits up to this long for others to be validated
#                          with it in one GX call (GX costs ~5 ms per expectation per call);
#                          the collect flow flushes at once whenever it waits for a settle
VALIDATION_MAX_BATCHES = SETTLE_BACKLOG // 2  # batches validated together (one GX call); half
#                          the backlog, so the call goes out before fetching has to wait for it

# --- Dead letters and triage ---------------------------------------------------------------
DEADLETTER_ARCHIVE_BYTES = 64 * 1024 * 1024  # the JSONL archive is rotated past this size
TRIAGE_CLAIM_S = 300.0  # a triage run holds an entry this long; a crashed run's claims expire
TRIAGE_LIMIT = 10_000  # open entries one triage run looks at
TRIAGE_MAX_REQUEUES = 3  # a recoverable fetch failure is re-enqueued at most this often, then
#                          escalated; the n-th waits retry.ceiling(n) after its last failure

# --- Backlog watermark ---------------------------------------------------------------------
# ratio = depth / capacity; a level is entered at its threshold and left only below its clear
# threshold (hysteresis), so a depth hovering around a threshold raises one event, not many.
BACKLOG_WARNING = 0.60  # ok -> warning at or above this ratio
BACKLOG_WARNING_CLEAR = 0.50  # warning -> ok (recovered) below this ratio
BACKLOG_CRITICAL = 0.80  # -> critical at or above this ratio
BACKLOG_CRITICAL_CLEAR = 0.70  # critical -> warning below this ratio
BACKLOG_TREND_S = 300.0  # without backlog.capacity, a level rises only if the depth has not
#                          shrunk over this long (a first run's full queue is not overload)
BACKLOG_SAMPLES = 48  # trend samples kept per source (a Prefect Variable holds at most 5000 chars)
BACKLOG_MAX_SAMPLES = 100  # upper bound of `backlog.samples`, so the state fits in one Variable

# --- Locks (Prefect global concurrency limits) ---------------------------------------------
LOCK_WAIT_S = 90.0  # a `run` waits this long for source:<name> before exiting with code 3;
#                    longer than LOCK_LEASE_S, so the lock of a run that died is outwaited
LOCK_LEASE_S = 60.0  # lease of a held lock, renewed every 3/4 of it (Prefect's minimum: 60)
LOCK_POLL_S = 2.0  # a waiting `run` tries source:<name> again this often (one API call a try)
DOMAIN_LOCK_WAIT_S = 600.0  # a batch waits this long for its domain:<host> slots
HEARTBEAT_S = 5.0  # every run and helper records that it is alive this often (frontier.beat)
HOLDER_DEAD_AFTER_S = 30.0  # a holder silent this long is dead: its leases are revoked at once
STOP_GRACE_S = 2.0  # after a stop request, requests in flight get this long, then are cut off
DRAIN_POLL_S = 1.0  # while draining waits for others' leases, the frontier is looked at this often
WORK_IDLE_WAIT_S = 30.0  # `collector work` waits this long for items when the frontier is empty

# --- Metrics (collector/ops/metrics.py) ----------------------------------------------------
METRICS_MAX_HOSTS = 20  # most `host` label values per source and process, for a source that opts
#                         in (metrics.hosts, at most this; env COLLECTOR_METRICS_MAX_HOSTS caps it
#                         lower); later hosts, and every host of other sources, are "other"
METRICS_SAMPLE_S = 5.0  # frontier depth and backlog gauges are sampled at most this often per run

# robots.txt (collector/fetch/robots.py, politeness.robots)
ROBOTS = "obey"  # obey | ignore
ROBOTS_TTL_S = 86_400.0  # a host's robots.txt is fetched again after a day (Google: up to 24 h)
ROBOTS_UNREACHABLE_S = 1_800.0  # robots.txt answered 429/5xx: the host's pages wait this long

# --- Fleet: many sources on one pool (collector/fleet/, flows/fleet.py, docs/fleet.md) ---------
FLEET_POOL = "collector"  # the Prefect work pool every source's deployment and helper runs on
FLEET_MAX_HELPERS = 4  # most `collector work` helpers one source gets (schedule.max_helpers)
FLEET_BUDGET = 4  # helpers the autoscaler runs at once across all sources (the pool's share)
FLEET_WAIT_HIGH_S = 0.05  # a due item waiting longer than this before a claim asks for a helper...
FLEET_WAIT_HELD_S = 1.0  # ...when the wait stayed above it this long (not one sample's spike)
FLEET_BUSY_HIGH = 0.9  # helpers busier than this share of their time ask for one more
FLEET_CPU_HIGH = 0.75  # helpers whose process used more of a core than this ask for one more
FLEET_REPORT_S = 2.0  # a helper reports its CPU share (a label of its flow run) this often
FLEET_SAMPLE_S = 0.1  # the autoscaler samples each frontier this often (the 50 ms rule's scale)
FLEET_LOAD_CAP = 4.0  # loadFactor's ceiling: a huge backlog weighs at most (1 + this) x its class
FLEET_BACKLOG_UNIT = 1000  # due items that add 1 to loadFactor (log-scaled above it)
FLEET_HELPER_IDLE_S = 5.0  # a helper ends after its frontier had nothing due this long
# the seeds' scaling rules (schedule: section, per source; docs/fleet.md "Scaling rules")
FLEET_MIN_HELPERS = 0  # seed minSize: fewest helpers a source with due items keeps
FLEET_SCALE_FACTOR = 1.2  # busy held: helpers -> ceil(helpers x 1.2), at least +1 (seed: +20 %)
FLEET_DEPTH_SHARE = 0.8  # seed targetSize = max(minSize, ceil(depth x 0.8 / throughput))...
FLEET_SIZE_HORIZON_S = 60.0  # ...throughput: what one helper claims in this long (items)
FLEET_BUSY_HELD_S = 5.0  # busy above FLEET_BUSY_HIGH this long before a step up (a helper's start)
FLEET_IDLE_BELOW = 0.3  # helpers busy less than this share of their time are idle...
FLEET_IDLE_HELD_S = 30.0  # ...for this long: one step down (helpers -> floor(helpers / 1.2))
FLEET_MEMORY_HIGH = 0.85  # helpers' memory share (cgroup or machine) above this...
FLEET_MEMORY_HELD_S = 10.0  # ...for this long: one step down; above it at all: no step up
# a helper's start (its creation to its first claim), measured by the fleet: before any is
# measured it is taken as this (3.6 s on a quiet 2-core box, 17-29 s with 8 runs loading it)
FLEET_START_PRIOR_S = 15.0
FLEET_START_KEEP = 5  # the expected start is the median of the last this many measured
# a source's run on its way, before it planned, is sized by what it is expected to have due
# (collector.fleet.forecast) at the throughput last measured for it, else this many items/s per
# request slot of a process (limits.concurrency): a page a second, a web page's order of size
FLEET_SLOT_RATE_PRIOR = 1.0
FLEET_COMING_FOR = 3.0  # a process not claiming yet is capacity on its way until this x start
# a helper is started only when it would claim at least this many of its starts' time after it
# arrives (the source's drain with the processes on their way counted > (1 + this) x start)
FLEET_ARRIVAL_WORK = 1.0
