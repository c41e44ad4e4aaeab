"""The fetch engine: many URLs at once, politely, within deadlines, on httpx.

What it guarantees for each URL of a batch:

* **bounded concurrency**: at most ``concurrency`` requests in flight, at most
  ``per_domain_concurrency`` per host, and at most ``per_domain_rate`` requests per host;
* **deadlines that cancel**: an attempt is cancelled at ``request_deadline_s`` wall-clock (the
  httpx timeout, ``http_timeout_s``, applies to each read inside it); the whole batch stops
  starting new work before the batch task's own timeout, so results are returned, not lost;
* **safety**: scheme and host are checked before the first byte and at every redirect hop
  (:mod:`collector.policy.urls`), and bodies larger than ``max_response_bytes`` are cut off,
  counted in decoded bytes and decoded no further than that (:mod:`collector.fetch.decoding`);
* **retries**: recoverable failures are retried under the source's retry policy
  (:mod:`collector.policy.retry`); waits short enough are done here, longer ones are returned as
  ``later`` for the frontier to schedule;
* **outages and load** (see docs/politeness.md): a host whose circuit breaker is open gets no
  request; its items are returned ``deferred`` until the breaker may close
  (:mod:`collector.fetch.circuit`). With an adaptive window, a host's requests in flight follow
  its load between 1 and ``per_domain_concurrency`` (:mod:`collector.fetch.adaptive`).

Requests go through httpx's API; the connection pool under it is aiohttp's by default (about
1.6x the pages/s of httpx's own, see :mod:`collector.fetch.transport`). The engine lends a
client per request from a queue holding one entry per allowed connection, which is also what
bounds the requests in flight.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Self

import httpx

from collector import defaults
from collector.errors import FetchError, PermanentFetchError, RecoverableFetchError
from collector.fetch import conditional, heap
from collector.fetch.adaptive import HostGate, Signal
from collector.fetch.circuit import (
    GO,
    CircuitBoard,
    CircuitListener,
    HostCircuit,
    RedisCircuitStore,
)
from collector.fetch.decoding import ACCEPT_ENCODING, BodyTooLarge, bounded_decoder
from collector.fetch.looplag import LoopLag
from collector.fetch.pacing import Degrade
from collector.fetch.prebuilt import RequestMaker
from collector.fetch.ratelimit import RateLimiter, rate_limiter
from collector.fetch.robots import MAX_BYTES as _ROBOTS_MAX_BYTES
from collector.fetch.robots import RedisRobotsStore, Robots, RobotsPolicy
from collector.fetch.sharing import FairShares
from collector.fetch.tail import BatchTail
from collector.fetch.transport import POOL_ERROR as _POOL_ERROR
from collector.fetch.transport import TransportKind, connect_failure, make_clients, pool_failure
from collector.frontier.base import ClaimedItem
from collector.ops import metrics
from collector.policy.retry import (
    RetryBudget,
    RetryDecision,
    RetrySettings,
    RetryTimeBudget,
    is_recoverable_status,
)
from collector.policy.retry import parse_retry_after as _parse_retry_after
from collector.policy.urls import HostPolicy, shown

if TYPE_CHECKING:
    from collector.config import AdaptiveSettings, Source

__all__ = ["BATCH_STARTED", "FetchEngine", "FetchResult", "HostSlot", "host_of"]

BATCH_STARTED: ContextVar[Callable[[], None] | None] = ContextVar(
    "collector_batch_started", default=None
)
"""Called once when every item of a batch fetched in this context has sent its first request
or ended: none waits for a request slot (its host's window, rate, a client) any more.

The run loop (collector.run.drain) sets it around its fetch step to claim the next batch while
this one's last requests are in flight; a context variable, so it reaches the engine through
the flow's Prefect task (which runs in a copy of the caller's context) without a parameter."""

# Shares of the batch timeout: attempts start no later than _START_BY of it (minus one request
# deadline) and anything still running at _STOP_AT is cut off, so the batch returns its results
# before Prefect's task timeout would cancel it and lose them.
_START_BY = 0.85
_STOP_AT = 0.95


# what one request brought back: final URL, status, body, content type, validators
_Answer = tuple[str, int, bytes, str, conditional.Validators]


class _TooLate(Exception):
    """The batch is out of time to start this attempt."""


class _Deferred(Exception):
    """The host's circuit breaker is open, or its 429 degrade hands the request back: come back
    at ``not_before`` (wall clock)."""

    def __init__(self, not_before: float, why: str = "circuit_open") -> None:
        self.not_before = not_before
        self.why = why


class HostSlot:
    """Everything one engine keeps about one host, in one place (as Scrapy's downloader keeps a
    ``Slot`` per domain): made at the host's first item, found once per item, never per request.

    ``gate`` holds the host's requests in flight and its window (made at its first attempt
    that gets past an open breaker, so a host the breaker kept back has no window to report);
    ``breaker`` is the host's circuit breaker (None without one); ``answers`` counts what the
    host answered this run ("200", "503", "connect_error" ...) and ``connect_reasons`` why it
    could not be connected to ("connection refused" ...): the end-of-run lines of a host that
    is down (:meth:`FetchEngine.host_report`); ``degrade`` samples its requests while it
    answers 429 (``retry.degrade_share`` < 1, else None).
    """

    __slots__ = ("answers", "breaker", "connect_reasons", "degrade", "gate", "host")

    def __init__(
        self, host: str, breaker: HostCircuit | None, degrade: Degrade | None = None
    ) -> None:
        self.host = host
        self.gate: HostGate | None = None
        self.breaker = breaker
        self.degrade = degrade
        self.answers: Counter[str] = Counter()
        self.connect_reasons: Counter[str] = Counter()


@dataclass(slots=True)
class _Progress:
    """How far one item got, readable after its task was cancelled; with its host's slot and,
    under shared domain limits, the batch's cap for that host."""

    item: ClaimedItem
    slot: HostSlot
    cap: asyncio.Semaphore | None = None
    starts: _Starts | None = None  # the batch's count of items not yet sent, until this one is
    attempts: int = 0
    first_attempt_at: float = 0.0
    last_error: FetchError | None = None
    sent_at: float = 0.0  # monotonic time the current attempt was sent (request latency)

    def __post_init__(self) -> None:
        self.attempts = self.item.attempts
        self.first_attempt_at = self.item.first_attempt_at or time.time()


class _Starts:
    """A batch's items that have not sent a request yet (nor ended): ``then`` is called once
    when none is left (see :data:`BATCH_STARTED`)."""

    __slots__ = ("left", "then")

    def __init__(self, left: int, then: Callable[[], None]) -> None:
        self.left = left
        self.then = then

    def one(self, progress: _Progress) -> None:
        """``progress`` sent its first request, or ended: counted once."""
        if progress.starts is not self:
            return
        progress.starts = None
        self.left -= 1
        if self.left == 0:
            self.then()


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What happened to one URL of a batch.

    ``status`` ``ok``: ``body`` holds the response; ``not_modified``: the server answered 304 to
    the item's validators (no body: the stored records stand, collector.fetch.conditional);
    ``failed``: ``error`` and ``decision`` say why
    and what next (retry later or dead); ``skipped``: the batch ran out of time before this URL
    was tried, so it goes back to the queue unchanged; ``deferred``: the host's circuit breaker
    is open (``deferred_why`` ``circuit_open``) or its 429 degrade did not sample the request
    (``rate_degraded``), so it goes back to the queue not before ``not_before`` (not an attempt).
    """

    url: str
    status: Literal["ok", "not_modified", "failed", "skipped", "deferred"]
    attempts: int  # total attempts of this item so far, across batches
    first_attempt_at: float
    final_url: str | None = None
    http_status: int | None = None
    body: bytes = b""
    content_type: str = ""
    elapsed_s: float = 0.0
    error: FetchError | None = None
    decision: RetryDecision | None = None
    not_before: float = 0.0  # deferred: wall-clock time the host may be tried again
    deferred_why: str = "circuit_open"  # deferred: the item's reason in the queue
    # ok / not_modified: the validators to keep with the item (collector.fetch.conditional)
    etag: str | None = None
    last_modified: str | None = None


class FetchEngine:
    """Fetch batches of claimed items. Use as ``async with FetchEngine(...) as engine``.

    Everything is set at construction (as httpx's clients are); what changes afterwards is
    the engine's own state: :meth:`halt`, and what it learns about hosts (:attr:`slots`).
    ``on_item`` is called with each item's result as soon as its fetch ends (a progress display
    counts items, not batches); it must be quick and must not raise; cut-off items are not
    reported. ``circuit_listeners`` are told when a breaker opens or closes. ``conditional``
    sends a page's validators back (``politeness.conditional``); ``robots`` obeys robots.txt
    (``politeness.robots: obey``, :class:`collector.fetch.robots.RobotsPolicy`).
    """

    def __init__(
        self,
        *,
        retry: RetrySettings,
        host_policy: HostPolicy,
        http_timeout_s: float = defaults.HTTP_TIMEOUT_S,
        request_deadline_s: float = defaults.REQUEST_DEADLINE_S,
        concurrency: int = defaults.CONCURRENCY,
        per_domain_concurrency: int = defaults.PER_DOMAIN_CONCURRENCY,
        rate_limiter: RateLimiter | None = None,
        max_response_bytes: int = defaults.MAX_RESPONSE_BYTES,
        follow_redirects: bool = True,
        max_redirects: int = defaults.MAX_REDIRECTS,
        headers: dict[str, str] | None = None,
        transport: TransportKind = defaults.TRANSPORT,  # type: ignore[assignment]
        rng: random.Random | None = None,
        circuit: CircuitBoard | None = None,
        adaptive: AdaptiveSettings | None = None,
        conditional: bool = True,
        robots: RobotsPolicy | None = None,
        on_item: Callable[[FetchResult], None] | None = None,
        circuit_listeners: Sequence[CircuitListener] = (),
        stop_grace_s: float = defaults.STOP_GRACE_S,
    ) -> None:
        self.retry = retry
        self.time_budget = (
            RetryTimeBudget(limit_s=retry.budget_time_s, window_s=retry.budget_window_s)
            if retry.budget_time_s is not None
            else None
        )
        self.host_policy = host_policy
        self.http_timeout_s = http_timeout_s
        self.request_deadline_s = request_deadline_s
        self.concurrency = concurrency
        self.per_domain_concurrency = per_domain_concurrency
        self.rate_limiter = rate_limiter
        self.max_response_bytes = max_response_bytes
        self.follow_redirects = follow_redirects
        self.max_redirects = max_redirects
        self.headers = {"User-Agent": defaults.USER_AGENT, **(headers or {})}
        if not any(name.lower() == "accept-encoding" for name in self.headers):
            # Ask only for the encodings decoded within the cap (collector.fetch.decoding).
            self.headers["Accept-Encoding"] = ACCEPT_ENCODING
        self.transport: TransportKind = transport
        self.rng = rng or random.Random()
        self.conditional = conditional
        self.on_item = on_item
        self.stop_grace_s = stop_grace_s
        self.circuit = circuit  # None: no breaker
        if circuit is not None:
            circuit.listeners.extend(circuit_listeners)
        self.adaptive = adaptive if adaptive is not None and adaptive.enabled else None
        self.robots: Robots | None = None
        if robots is not None:
            self.robots = Robots(
                user_agent=next(v for k, v in self.headers.items() if k.lower() == "user-agent"),
                ttl_s=robots.ttl_s,
                unreachable_s=robots.unreachable_s,
                fetch=self._fetch_robots,
                store=robots.store,
            )
        self.requests_sent = 0
        # per-batch request counts for Prometheus (collector.ops.metrics), None when metrics are off
        self.tally = metrics.RequestTally() if metrics.enabled() else None
        self.slots: dict[str, HostSlot] = {}  # host -> all the engine keeps about it
        self._clients: list[httpx.AsyncClient] = []
        self._lendable: FairShares[httpx.AsyncClient] | None = None
        # each client's requests, built from per-origin prototypes (collector.fetch.prebuilt)
        self._makers: dict[httpx.AsyncClient, RequestMaker] = {}
        # the item tasks of the batches being fetched, and of batches whose caller went away
        # (cancelled): closing the engine ends them before it closes the clients they use
        self._batches: dict[int, list[asyncio.Task[FetchResult]]] = {}
        self._orphans: set[asyncio.Task[FetchResult]] = set()
        self._closing = False  # its close has begun: what is cut off now is cut off as at a halt
        self._loop_lag = LoopLag()  # our own loop's lateness, out of the window's latencies
        self._halted = asyncio.Event()

    @property
    def halted(self) -> bool:
        return self._halted.is_set()

    def halt(self) -> None:
        """Stop the run's fetching: no attempt starts any more, and attempts in flight get
        ``stop_grace_s`` to finish before they are cut off. Items that did not finish come back
        ``skipped`` with their attempts as claimed (a stop is not an attempt)."""
        self._halted.set()

    @classmethod
    def for_source(
        cls,
        source: Source,
        *,
        rate_storage_uri: str = "memory://",
        circuit_storage_uri: str | None = None,
        on_item: Callable[[FetchResult], None] | None = None,
        circuit_listeners: Sequence[CircuitListener] = (),
    ) -> FetchEngine:
        """Build an engine from a :class:`collector.config.Source`.

        ``circuit_storage_uri`` (a redis:// URL) shares the circuit breakers and robots.txt
        files with every worker of the source; without it each worker has its own.
        """
        limits = source.limits
        politeness = source.politeness
        circuit = None
        if limits.circuit.enabled:
            store = (
                RedisCircuitStore(circuit_storage_uri, source.name, limits.circuit)
                if circuit_storage_uri
                else None
            )
            circuit = CircuitBoard(
                limits.circuit, store=store, probe_window_s=source.ttl.request_deadline_s
            )
        robots = None
        if politeness.robots == "obey":
            robots = RobotsPolicy(
                ttl_s=politeness.robots_ttl_s,
                unreachable_s=politeness.robots_unreachable_s,
                store=RedisRobotsStore(circuit_storage_uri, source.name)
                if circuit_storage_uri
                else None,
            )
        return cls(
            retry=source.retry,
            host_policy=HostPolicy(
                allow_private_networks=source.allow_private_networks,
                allowed_hosts=limits.allowed_hosts,
            ),
            http_timeout_s=source.ttl.http_timeout_s,
            request_deadline_s=source.ttl.request_deadline_s,
            concurrency=limits.concurrency,
            per_domain_concurrency=limits.per_domain_concurrency,
            rate_limiter=(
                rate_limiter(limits.per_domain_rate, storage_uri=rate_storage_uri)
                if limits.per_domain_rate
                else None
            ),
            max_response_bytes=limits.max_response_bytes,
            follow_redirects=limits.follow_redirects,
            max_redirects=limits.max_redirects,
            headers=source.resolved_headers(),
            transport=limits.transport,
            circuit=circuit,
            adaptive=limits.adaptive,
            conditional=politeness.conditional,
            robots=robots,
            on_item=on_item,
            circuit_listeners=circuit_listeners,
        )

    # --- what the engine knows about hosts (progress, summary, metrics gauges) -------------
    def slot(self, host: str) -> HostSlot:
        """``host``'s slot, made on first use."""
        slot = self.slots.get(host)
        if slot is None:
            breaker = self.circuit.host(host) if self.circuit is not None else None
            retry = self.retry
            degrade = (
                Degrade(retry.degrade_share, retry.degrade_hold_s)
                if retry.degrade_share < 1
                else None
            )
            slot = self.slots[host] = HostSlot(host, breaker, degrade)
        return slot

    def _new_gate(self) -> HostGate:
        """A host's gate, made at its first attempt (a benchmark puts another kind in)."""
        return HostGate(self.per_domain_concurrency, self.adaptive)

    def windows(self) -> dict[str, int]:
        """Each host's current concurrency window (adaptive mode only; empty when fixed)."""
        if self.adaptive is None:
            return {}
        return {host: s.gate.limit for host, s in self.slots.items() if s.gate is not None}

    def slowed(self) -> dict[str, str]:
        """Host -> why it is held back, for the hosts that are (adaptive mode only)."""
        if self.adaptive is None:
            return {}
        return {
            host: why
            for host, s in self.slots.items()
            if s.gate is not None and (why := s.gate.slowdown())
        }

    def host_report(self) -> dict[str, Any]:
        """Windows, slowed hosts and breakers for the run's summary and progress (plain JSON
        values).

        ``slowed`` maps each host held back by its window or pacing to the one-line reason
        (:meth:`collector.fetch.adaptive.HostGate.slowdown`). ``hosts`` holds, per host this
        engine sent to, what it answered (status codes, or the error class when there was no
        HTTP answer), its breaker (``closed``, ``open``, ``half-open``, or ``off`` without one)
        and ``retry_at``, the epoch second an open breaker lets requests through again (null
        otherwise): what the end of a run says about a host that is down
        (:attr:`collector.run.summary.RunSummary.hosts_down`).
        """
        report: dict[str, Any] = {"windows": self.windows(), "slowed": self.slowed()}
        if self.circuit is not None:
            report["circuit"] = {
                "opened": self.circuit.opened,
                "closed": self.circuit.closed,
                "open_until": {h: round(u, 3) for h, u in self.circuit.open_hosts().items()},
            }
        open_until = self.circuit.open_hosts() if self.circuit is not None else {}
        hosts: dict[str, Any] = {}
        for host, slot in self.slots.items():
            if not slot.answers:
                continue  # never sent to (kept back, or not yet)
            facts = hosts[host] = self._host_facts(slot.answers, open_until.get(host))
            if slot.connect_reasons:
                facts["connect_errors"] = dict(slot.connect_reasons)
        report["hosts"] = hosts
        return report

    def _host_facts(self, answers: Counter[str], until: float | None) -> dict[str, Any]:
        facts: dict[str, Any] = {"answers": dict(answers), "breaker": "off", "retry_at": None}
        if self.circuit is None:
            return facts
        if until is None:
            facts["breaker"] = "closed"
        elif self.circuit.clock() < until:
            facts.update(breaker="open", retry_at=round(until, 3))
        else:
            facts["breaker"] = "half-open"
        return facts

    @property
    def circuit_listeners(self) -> list[CircuitListener]:
        """Callbacks ``(kind, data)`` told when a breaker opens or closes (the flow's events)."""
        return self.circuit.listeners if self.circuit is not None else []

    # --- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        # One TLS context for all clients: building one loads the CA bundle (~10 ms each).
        self._clients = make_clients(
            self.transport,
            connections=self.concurrency,
            tls=httpx.create_ssl_context(),
            host_policy=self.host_policy,
            timeout=httpx.Timeout(self.http_timeout_s),
            headers=self.headers,
            follow_redirects=self.follow_redirects,
            max_redirects=self.max_redirects,
            event_hooks={"request": [self._check_request]},
        )
        # Each host's requests take clients in turn, the host holding fewest first: a slow
        # host cannot hold them all (collector.fetch.sharing).
        self._lendable = FairShares(
            self._clients[i % len(self._clients)] for i in range(self.concurrency)
        )
        self._makers = {client: RequestMaker(client) for client in self._clients}
        self._closing = False
        if self.adaptive is not None:
            self._loop_lag.start()
        heap.frozen()  # start-up's objects out of the collector's walks (collector.fetch.heap)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        heap.thawed()
        # A fetch still running (its batch's caller cancelled, or a batch fetched beside the
        # close) ends here, while its client is still open: its item comes back as at a halt
        # (skipped, unchanged) instead of failing on a closed pool after the engine is gone.
        live = [t for tasks in self._batches.values() for t in tasks] + list(self._orphans)
        for task in live:
            task.cancel()
        if live:
            await asyncio.gather(*live, return_exceptions=True)
        await self._loop_lag.stop()
        await asyncio.gather(*(client.aclose() for client in self._clients))
        self._clients.clear()
        self._makers = {}
        self._lendable = None
        if self.circuit is not None:
            await self.circuit.aclose()
        if self.rate_limiter is not None:
            await self.rate_limiter.aclose()
        if self.robots is not None:
            await self.robots.store.aclose()

    async def _check_request(self, request: httpx.Request) -> None:
        # Runs before the first request and before every redirect hop.
        url = request.url
        try:
            self.host_policy.check_request(url.scheme, url.host, str(url))
        except PermanentFetchError as exc:
            exc.add_note(str(url))  # the URL refused: _request tells a redirect's target by it
            raise

    # --- fetching --------------------------------------------------------------------------
    async def fetch_batch(
        self,
        items: Sequence[ClaimedItem],
        *,
        budget: RetryBudget,
        batch_timeout_s: float | None = None,
        host_slots: Mapping[str, int] | None = None,
    ) -> list[FetchResult]:
        """Fetch every item; results are in the order of ``items``. Never raises for one URL;
        raises a :class:`~collector.errors.BackendError` when a shared rate limit's Redis stays
        away past its wait (collector.fetch.ratelimit), and the caller gives the batch back.

        With ``batch_timeout_s``, the batch returns before it: no attempt starts later than
        ``_START_BY`` of it minus a request deadline (the first wave always starts), and at
        ``_STOP_AT`` of it whatever is still running is cancelled. An item that never started is
        ``skipped`` (back to the queue as it was); one cut off mid-attempt counts as a timeout.

        With ``host_slots`` (host -> slots granted by the shared ``domain:<host>`` limits, see
        collector.run.locks), at most that many of the batch's items of a host are in flight at
        once.
        """
        if self._lendable is None:
            raise RuntimeError("FetchEngine must be used inside 'async with'")
        started = time.monotonic()
        budget_s = batch_timeout_s if batch_timeout_s is not None else math.inf
        start_by = started + max(budget_s * _START_BY - self.request_deadline_s, budget_s / 2)
        stop_at = started + budget_s * _STOP_AT
        progress = self._progress(items, host_slots)
        tail = BatchTail(len(progress))
        on_item = self.on_item
        all_started = BATCH_STARTED.get()
        if all_started is not None and progress:
            starts = _Starts(len(progress), all_started)
            for p in progress:
                p.starts = starts

        async def fetch_one(p: _Progress) -> FetchResult:
            try:
                if p.cap is None:
                    result = await self._fetch_item(p, budget, start_by, tail)
                else:
                    async with p.cap:
                        result = await self._fetch_item(p, budget, start_by, tail)
            finally:
                tail.finished()
                if p.starts is not None:
                    p.starts.one(p)
            if on_item is not None:
                on_item(result)
            return result

        tasks = [asyncio.create_task(fetch_one(p)) for p in progress]
        if not tasks:
            return []
        timeout = None if math.isinf(stop_at) else max(stop_at - time.monotonic(), 0.0)
        self._batches[id(tasks)] = tasks
        try:
            pending = await self._wait(tasks, timeout)
        except BaseException:  # our caller went away (cancelled): its tasks must not outlive it
            self._orphan(tasks)
            raise
        finally:
            del self._batches[id(tasks)]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        # cancelled: by the engine's close (a stop, as a halt) or at the batch's stop time
        pending.update(t for t in tasks if t.cancelled())
        # A task that raised (not one URL's failure: a backend such as the rate limiter's Redis
        # gave up) fails the batch; every such exception is retrieved, so none is logged later
        # as "Task exception was never retrieved" with a traceback.
        raised = [e for t in tasks if t not in pending and (e := t.exception()) is not None]
        if raised:
            raise raised[0]
        cut_off = self._stopped if self.halted or self._closing else self._cut_off
        return [
            cut_off(p) if task in pending else task.result()
            for task, p in zip(tasks, progress, strict=True)
        ]

    def _orphan(self, tasks: list[asyncio.Task[FetchResult]]) -> None:
        """A batch's caller is gone: its tasks are cancelled, kept for the engine's close until
        they end, and their outcomes retrieved (nothing logged as never retrieved)."""
        for task in tasks:
            if not task.done():
                task.cancel()
                self._orphans.add(task)
                task.add_done_callback(self._orphan_ended)
            else:
                self._orphan_ended(task)

    def _orphan_ended(self, task: asyncio.Task[FetchResult]) -> None:
        self._orphans.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its batch's caller is gone, no one else will

    def _progress(
        self, items: Sequence[ClaimedItem], host_slots: Mapping[str, int] | None
    ) -> list[_Progress]:
        """Each item's progress, with its host's slot (one look-up per host of the batch) and
        the batch's cap for that host under shared domain limits."""
        caps = {host: asyncio.Semaphore(n) for host, n in (host_slots or {}).items()}
        found: dict[str, HostSlot] = {}
        progress = []
        for item in items:
            host = _host_of(item.url)
            slot = found.get(host)
            if slot is None:
                slot = found[host] = self.slot(host)
            progress.append(_Progress(item, slot, caps.get(host) if caps else None))
        return progress

    async def _wait(
        self, tasks: list[asyncio.Task[FetchResult]], timeout: float | None
    ) -> set[asyncio.Task[FetchResult]]:
        """Wait for the batch until its stop time, or until ``stop_grace_s`` after a halt."""
        everything = asyncio.ensure_future(asyncio.wait(tasks, timeout=timeout))
        halted = asyncio.ensure_future(self._halted.wait())
        try:
            await asyncio.wait({everything, halted}, return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():
                await asyncio.wait({everything}, timeout=self.stop_grace_s)
        finally:
            halted.cancel()
            if not everything.done():
                everything.cancel()
        return {task for task in tasks if not task.done()}

    def _stopped(self, progress: _Progress) -> FetchResult:
        """The result of an item cut off by a halt: back to the queue as it was claimed."""
        item = progress.item
        return FetchResult(item.url, "skipped", item.attempts, progress.first_attempt_at)

    def _cut_off(self, progress: _Progress) -> FetchResult:
        """The result of an item whose task was cancelled at the batch's stop time."""
        item = progress.item
        if progress.attempts == item.attempts:  # never sent a request
            return FetchResult(item.url, "skipped", item.attempts, progress.first_attempt_at)
        error = RecoverableFetchError(
            "cut off by the batch deadline before the response completed", error_class="timeout"
        )
        decision = self.retry.for_url(item.url).decide(
            error,
            attempts=progress.attempts,
            first_attempt_at=progress.first_attempt_at,
            now=time.time(),
            budget=None,
            rng=self.rng,
        )
        if decision.action == "inline":
            decision = RetryDecision("later", decision.delay_s, decision.reason)
        if self.tally is not None:
            self.tally.request(progress.slot.host, None, None)
            if decision.action != "dead":
                self.tally.retry(decision.reason)
        return FetchResult(
            item.url, "failed", progress.attempts, progress.first_attempt_at,
            error=error, decision=decision,
        )  # fmt: skip

    # --- one item: attempts until an answer, a final failure, or no more time -------------
    async def _fetch_item(
        self, progress: _Progress, budget: RetryBudget, start_by: float, tail: BatchTail
    ) -> FetchResult:
        item = progress.item
        if self.robots is not None and (refused := await self._robots_refusal(progress)):
            return refused
        while True:
            began = time.monotonic()
            try:
                answer = await self._attempt(progress, budget, start_by)
            except _Deferred as deferred:
                return FetchResult(
                    item.url, "deferred", progress.attempts, progress.first_attempt_at,
                    not_before=deferred.not_before, deferred_why=deferred.why,
                )  # fmt: skip
            except _TooLate:
                return self._not_started(progress)
            except FetchError as error:
                decision = await self._after_failure(progress, error, budget, start_by, tail)
                if decision is None:
                    continue  # waited out here: the next attempt
                return FetchResult(
                    item.url, "failed", progress.attempts, progress.first_attempt_at,
                    http_status=error.status_code, elapsed_s=time.monotonic() - began,
                    error=error, decision=decision,
                )  # fmt: skip
            return self._fetched(progress, answer, began)

    def _not_started(self, progress: _Progress) -> FetchResult:
        """The batch had no time left for the item's next attempt: back unchanged, or, after a
        failed attempt, due again at once."""
        item, error = progress.item, progress.last_error
        if error is None:
            return FetchResult(item.url, "skipped", progress.attempts, progress.first_attempt_at)
        return FetchResult(
            item.url, "failed", progress.attempts, progress.first_attempt_at,
            http_status=error.status_code, error=error,
            decision=RetryDecision("later", 0.0, error.error_class),
        )  # fmt: skip

    async def _after_failure(
        self,
        progress: _Progress,
        error: FetchError,
        budget: RetryBudget,
        start_by: float,
        tail: BatchTail,
    ) -> RetryDecision | None:
        """What the retry policy makes of a failed attempt: None when its wait was done here
        (attempt again), else the decision to return (later, or dead)."""
        progress.last_error = error
        decision = self.retry.for_url(progress.item.url).decide(
            error,
            attempts=progress.attempts,
            first_attempt_at=progress.first_attempt_at,
            now=time.time(),
            budget=budget,
            rng=self.rng,
            time_budget=self.time_budget,
        )
        if self.tally is not None:
            self.tally.request(
                progress.slot.host, error.status_code, time.monotonic() - progress.sent_at
            )
            if decision.action != "dead":
                self.tally.retry(decision.reason)
        if decision.action == "inline" and time.monotonic() + decision.delay_s <= start_by:
            left = await tail.wait_out(decision.delay_s)
            if not left:
                return None
            # the rest of the batch is done: the run goes on, the item is due then
            decision = RetryDecision("later", left, decision.reason)
        if decision.action == "inline":
            decision = RetryDecision("later", decision.delay_s, decision.reason)
        return decision

    def _fetched(self, progress: _Progress, answer: _Answer, began: float) -> FetchResult:
        item = progress.item
        final_url, status, body, content_type, validators = answer
        if self.tally is not None:
            self.tally.request(progress.slot.host, status, time.monotonic() - progress.sent_at)
        if status == 304:  # only ever answered to validators sent (see _request)
            validators = conditional.after_not_modified(item, validators)
        return FetchResult(
            item.url,
            "not_modified" if status == 304 else "ok",
            progress.attempts,
            progress.first_attempt_at,
            final_url=final_url,
            http_status=status,
            body=body,
            content_type=content_type,
            elapsed_s=time.monotonic() - began,
            etag=validators.etag,
            last_modified=validators.last_modified,
        )

    # --- one attempt: admitted by the host's limits, sent, its outcome told ----------------
    async def _attempt(self, progress: _Progress, budget: RetryBudget, start_by: float) -> _Answer:
        """One request under every limit; returns (final_url, status, body, content type,
        validators).

        Raises _TooLate, without sending anything, when the slot is only free after
        ``start_by``, _Deferred when the host's circuit breaker keeps it back, and the
        attempt's FetchError when it failed.
        """
        async with self._admitted(progress, start_by) as admitted:
            if progress.starts is not None:  # past its host's limits: no longer waiting
                progress.starts.one(progress)
            progress.attempts += 1
            progress.sent_at = time.monotonic()
            budget.record_request()
            self.requests_sent += 1
            sent_at = admitted.gate.sent()
            try:
                answer = await self._send(admitted.client, progress)
            except asyncio.CancelledError:
                admitted.gate.unanswered(sent_at)  # never answers: its epoch must not wait for it
                raise
            except FetchError as error:
                await self._told_failure(progress, admitted, error, sent_at)
                raise
            await self._told_answer(progress, admitted, answer[1], sent_at)
            return answer

    def _admitted(self, progress: _Progress, start_by: float) -> _Admitted:
        """``async with`` this: the attempt's way through its host's breaker, window, rate,
        Crawl-delay and a lent client (see :class:`_Admitted`)."""
        return _Admitted(self, progress, start_by)

    async def _send(self, client: httpx.AsyncClient, progress: _Progress) -> _Answer:
        """The request, cancelled at the request deadline (a timeout, recoverable)."""
        item = progress.item
        headers = conditional.request_headers(item) if self.conditional else None
        try:
            async with asyncio.timeout(self.request_deadline_s):
                return await self._request(client, item.url, headers)
        except TimeoutError:
            raise RecoverableFetchError(
                f"no complete response within the request deadline ({self.request_deadline_s:g} s)",
                error_class="timeout",
            ) from None

    async def _told_answer(
        self, progress: _Progress, admitted: _Admitted, status: int, sent_at: float
    ) -> None:
        """An HTTP answer (2xx, or a 304): counted, and told to the window and the breaker."""
        slot, url = progress.slot, progress.item.url
        slot.answers[str(status)] += 1
        raw_s = time.monotonic() - sent_at
        admitted.gate.observe(
            "ok", sent_at=sent_at, latency_s=self._loop_lag.discount(raw_s),
            paced=admitted.paced, url=url, raw_latency_s=raw_s,
        )  # fmt: skip
        if slot.breaker is not None:
            await slot.breaker.record(admitted.ticket, failed=False, url=url)

    async def _told_failure(
        self, progress: _Progress, admitted: _Admitted, error: FetchError, sent_at: float
    ) -> None:
        """A failed attempt: counted (with the reason a host could not be connected to), and
        told to the window and the breaker."""
        slot, url = progress.slot, progress.item.url
        slot.answers[str(error.status_code) if error.status_code else error.error_class] += 1
        if error.error_class == "connect_error":  # "cannot connect to h:p: <reason>"
            slot.connect_reasons[str(error).partition(": ")[2] or "could not connect"] += 1
        elif error.status_code == 429 and slot.degrade is not None:
            slot.degrade.throttled(time.time())
        admitted.gate.observe(
            _signal(error), sent_at=sent_at, latency_s=0.0, paced=admitted.paced, url=url
        )
        if slot.breaker is not None:
            await slot.breaker.record(admitted.ticket, failed=not error.permanent, url=url)

    async def _robots_refusal(self, progress: _Progress) -> FetchResult | None:
        """None when robots.txt lets the item be fetched; else its result, not an attempt:
        dead (``robots``) when disallowed, back later when robots.txt is unreachable."""
        assert self.robots is not None
        item = progress.item
        verdict = await self.robots.verdict(item.url)
        if verdict.allowed:
            return None
        if verdict.held_until is None:
            error: FetchError = PermanentFetchError(verdict.why, error_class="robots")
            decision = RetryDecision("dead", 0.0, "robots", cause="robots")
        else:
            error = RecoverableFetchError(verdict.why, error_class="robots_unreachable")
            delay = max(verdict.held_until - time.time(), 0.0)
            decision = RetryDecision("later", delay, "robots_unreachable")
        return FetchResult(
            item.url, "failed", progress.attempts, progress.first_attempt_at,
            error=error, decision=decision,
        )  # fmt: skip

    async def _fetch_robots(self, url: str) -> tuple[int | None, bytes]:
        """GET an origin's robots.txt on a lent client: (status, up to MAX_BYTES of its body),
        or (None, b"") when no answer came (collector.fetch.robots reads what it means)."""
        lendable = self._lendable
        if lendable is None:  # the engine closed: no answer
            return None, b""
        host = _host_of(url)
        client = await lendable.get(host)
        try:
            async with asyncio.timeout(self.request_deadline_s):
                async with client.stream("GET", url) as response:
                    body = bytearray()
                    if 200 <= response.status_code < 300:  # decoded within the cap, as pages
                        encoding = response.headers.get("content-encoding")
                        decoder = bounded_decoder(encoding, _ROBOTS_MAX_BYTES)
                        try:
                            async for raw in response.aiter_raw():
                                body += raw if decoder is None else decoder.decode(raw)
                                if len(body) >= _ROBOTS_MAX_BYTES:
                                    break
                        except BodyTooLarge:
                            pass  # what was read stands: the first MAX_BYTES are the rules
                    return response.status_code, bytes(body[:_ROBOTS_MAX_BYTES])
        except (TimeoutError, FetchError, httpx.HTTPError, OSError, _POOL_ERROR):
            return None, b""
        finally:
            lendable.put(host, client)

    async def _request(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
    ) -> _Answer:
        status: int | None = None  # the server's answer, kept on a too_large dead letter
        try:
            # What client.stream() does, without its context manager's generator per request;
            # the request as client.build_request() makes it (collector.fetch.prebuilt).
            response = await client.send(self._makers[client].get(url, headers), stream=True)
            try:
                status = response.status_code
                heads = _heads(response.headers)
                if status == 304 and headers:  # not modified since the validators we sent
                    return str(response.url), status, b"", "", heads.validators
                if status >= 300:
                    raise _status_error(response, url)
                declared = heads.content_length
                if declared and declared.isdigit() and int(declared) > self.max_response_bytes:
                    raise _too_large(self.max_response_bytes, status=status, declared=int(declared))
                chunks: list[bytes] = []
                size = 0
                # Raw bytes, decoded within the cap (collector.fetch.decoding): httpx's own
                # decoding inflates a whole network read at once, a gzip bomb included.
                decoder = bounded_decoder(heads.content_encoding, self.max_response_bytes)
                async for raw in response.aiter_raw():
                    chunk = raw if decoder is None else decoder.decode(raw)
                    size += len(chunk)
                    if size > self.max_response_bytes:
                        raise _too_large(self.max_response_bytes, status=status)
                    chunks.append(chunk)
                return (
                    str(response.url),
                    status,
                    b"".join(chunks),
                    heads.content_type,
                    heads.validators,
                )
            finally:
                await response.aclose()
        except FetchError as exc:
            hop = getattr(exc, "__notes__", [None])[-1]
            if exc.error_class == "refused_url" and hop and hop != str(httpx.URL(url)):
                raise PermanentFetchError(  # the page itself was allowed: a redirect was not
                    f"redirected to {shown(hop)}: {exc}", error_class="refused_url"
                ) from exc
            raise
        except BodyTooLarge:
            raise _too_large(self.max_response_bytes, status=status) from None
        except (httpx.HTTPError, OSError, _POOL_ERROR) as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: Exception) -> FetchError:
        """The fetch error an exception from httpx (or the pool under it) stands for."""
        from_pool = pool_failure(exc)  # aiohttp's cause, named more precisely
        if from_pool is not None:
            return from_pool
        if isinstance(exc, httpx.TimeoutException):
            return RecoverableFetchError(
                f"timed out ({type(exc).__name__}) after {self.http_timeout_s:g} s",
                error_class="timeout",
            )
        if isinstance(exc, httpx.TooManyRedirects):
            return PermanentFetchError(
                f"more than {self.max_redirects} redirects", error_class="too_many_redirects"
            )
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return PermanentFetchError(str(exc), error_class="refused_url")
        if isinstance(exc, httpx.DecodingError):
            return PermanentFetchError(
                f"cannot decode response body: {exc}", error_class="decode_error"
            )
        if isinstance(exc, httpx.ConnectError):
            return connect_failure(exc)  # host:port and the system's reason, in one line
        # Any other transport failure: the server or the network may behave next time.
        return RecoverableFetchError(f"{type(exc).__name__}: {exc}", error_class="network_error")


class _Admitted:
    """One attempt's way through its host's limits, as ``async with``, in this order: an open
    breaker known without I/O defers at once (not even queued); then a place in the host's
    window (``gate``, ``paced`` when its pacing made it wait), the host's 429 degrade (a
    request it does not sample is deferred, unsent), the breaker's ticket (a closed
    breaker's place in the send order, a half-open probe, or a deferral), the host's rate,
    its ``Crawl-delay`` and a lent ``client``; too late for the batch (or halted) by then, and
    nothing is sent. Leaving gives back, in reverse, whatever was taken, however the attempt
    ended (a ticket whose request never answered leaves the breaker's send order).
    """

    __slots__ = (
        "client", "engine", "gate", "lendable", "paced", "progress", "start_by", "ticket",
    )  # fmt: skip

    def __init__(self, engine: FetchEngine, progress: _Progress, start_by: float) -> None:
        self.engine = engine
        self.progress = progress
        self.start_by = start_by
        self.ticket = GO
        self.paced = False

    async def __aenter__(self) -> Self:
        engine, slot = self.engine, self.progress.slot
        breaker = slot.breaker
        if breaker is not None and (until := breaker.deferred_until()) is not None:
            raise _Deferred(until)  # known open: do not even queue for a place
        gate = slot.gate
        if gate is None:
            gate = slot.gate = engine._new_gate()
        self.gate = gate
        waiting = time.monotonic()
        self.paced = await gate.acquire()
        if engine.tally is not None:  # per-host slot wait (collector_host_slot_wait_seconds)
            engine.tally.slot_waited(time.monotonic() - waiting)
        try:
            self.client = await self._through(engine, slot)
        except BaseException:
            self._leave_gate(breaker)
            raise
        return self

    async def _through(self, engine: FetchEngine, slot: HostSlot) -> httpx.AsyncClient:
        """Past the breaker, the rate and the Crawl-delay: a lent client, in time."""
        host, breaker = slot.host, slot.breaker
        if slot.degrade is not None and (back := slot.degrade.admit(time.time(), engine.rng)):
            raise _Deferred(back, "rate_degraded")  # answers 429: not sampled, handed back
        if breaker is not None:
            self.ticket = await breaker.admit()
            if not self.ticket.go:
                raise _Deferred(self.ticket.not_before)
        if engine.rate_limiter is not None:
            await engine.rate_limiter.acquire(host)
        robots = engine.robots
        if robots is not None and not await robots.pace(
            self.progress.item.url, latest=self.start_by
        ):
            raise _TooLate  # its Crawl-delay slot is past the batch's time: back unchanged
        lendable = engine._lendable
        if lendable is None:  # the engine closed meanwhile: nothing is sent
            raise _TooLate
        client = await lendable.get(host)
        if time.monotonic() > self.start_by or engine._halted.is_set():
            lendable.put(host, client)
            raise _TooLate
        self.lendable = lendable
        return client

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The client goes back to the shares it was lent from, and only while the engine is
        # open (after its close there is nothing to give it back to); the gate and the
        # breaker's send order are always left. Never raises: an attempt's own outcome (or its
        # cancellation) is what propagates.
        if self.engine._lendable is self.lendable:
            self.lendable.put(self.progress.slot.host, self.client)
        self._leave_gate(self.progress.slot.breaker)

    def _leave_gate(self, breaker: HostCircuit | None) -> None:
        if breaker is not None:  # not sent, or cancelled: out of the breaker's send order
            breaker.forget(self.ticket)
        self.gate.release()


class _Heads(NamedTuple):
    """The response headers the engine reads (each as ``httpx.Headers.get`` gives it)."""

    content_length: str | None
    content_encoding: str | None
    content_type: str
    validators: conditional.Validators


_READ = frozenset({"content-length", "content-encoding", "content-type", "etag", "last-modified"})


def _heads(headers: httpx.Headers) -> _Heads:
    """The headers the engine reads, in one pass over the response's (``Headers.get`` walks
    and decodes all of them for each name); repeated headers are joined with ``", "`` as
    ``Headers.get`` joins them (tests/test_fetch_heads.py compares the two)."""
    found: dict[str, str] = {}
    for name, value in headers.multi_items():  # names lower-cased, decoded as httpx decodes
        if name in _READ:
            found[name] = f"{found[name]}, {value}" if name in found else value
    return _Heads(
        found.get("content-length"),
        found.get("content-encoding"),
        found.get("content-type", ""),
        conditional.validators_of(found),
    )


def host_of(url: str) -> str:
    """The host key of the engine's per-host limits (also the one of ``domain:<host>`` locks)."""
    return _host_of(url)


def _host_of(url: str) -> str:
    """The host of an absolute URL, cheaply (``urlsplit`` costs ~10 us a call on the hot path)."""
    _, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0].lower()
    return netloc.split(":", 1)[0].lower()


def _signal(error: FetchError) -> Signal:
    """What a failure says about the host's load (see collector.fetch.adaptive)."""
    if error.status_code in (429, 503):
        return "throttled"
    if error.error_class in ("timeout", "connect_error") or error.status_code in (502, 504):
        return "overload"
    return "other"


def _status_error(response: httpx.Response, url: str) -> FetchError:
    status = response.status_code
    if status < 400:
        location = response.headers.get("location", "")
        return PermanentFetchError(
            f"HTTP {status} redirect not followed (to {location!r})",
            error_class=f"http_{status}",
            status_code=status,
        )
    retry_after = _parse_retry_after(response.headers.get("retry-after"), now=time.time())
    message = f"HTTP {status} {response.reason_phrase}".strip()
    if is_recoverable_status(status):
        return RecoverableFetchError(
            message, error_class=f"http_{status}", status_code=status, retry_after_s=retry_after
        )
    return PermanentFetchError(message, error_class=f"http_{status}", status_code=status)


def _too_large(cap: int, *, status: int | None, declared: int | None = None) -> PermanentFetchError:
    what = f"declares {declared} bytes, over" if declared is not None else "is over"
    return PermanentFetchError(
        f"response body {what} the cap of {cap} bytes (limits.max_response_bytes)",
        error_class="too_large",
        status_code=status,
    )
