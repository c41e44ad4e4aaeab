"""robots.txt: fetched once per host and TTL, obeyed by default (``politeness.robots``).

Per origin (``scheme://host:port``) the engine asks :class:`Robots` for a :class:`Verdict`
before an item's first attempt. The file is fetched on first need, through the engine's own
clients (the host policy, timeouts and redirects of every request), and kept for
``politeness.robots_ttl_s``; concurrent items of one host wait for the same fetch, so a host
costs one robots.txt request per TTL however many of its pages a batch holds. The rules are
read by Protego (Scrapy's parser: ``Allow`` / ``Disallow`` with ``*`` and ``$``, the longest
match wins, groups per user agent, ``Crawl-delay``), matched against the user agent the source
sends (``limits.headers`` ``User-Agent``, else Collector's own).

What an answer means (RFC 9309 section 2.3.1, as Google documents it):

========================  ============================================================
robots.txt answers        the host's pages
========================  ============================================================
2xx                       the rules (a body over :data:`MAX_BYTES` is read up to it)
4xx but 429 (404, 403)    all allowed: the site has no rules (the demo and the tests'
                          local sites: one 404 per host and TTL, nothing else)
429, 5xx                  *held*: back to the queue, not an attempt, for
                          ``robots_unreachable_s``; a copy kept from before is used
                          instead while it is younger than :data:`STALE_KEEP_S`
no answer                 the pages' own requests decide (as without robots.txt), and
                          the file is asked for again after :data:`NO_ANSWER_RETRY_S`
========================  ============================================================

Why no answer is not a hold, unlike Google's rule: a host that does not answer at all is what
the circuit breaker and the retries are for (collector.fetch.circuit); holding its pages back
here would hide the outage from them and from the run's "hosts down" report, and a page cannot
be fetched from a host that does not answer anyway. A host that answers robots.txt with 5xx
but serves pages is the case the hold is for.

A disallowed URL is dead-lettered (permanent, error class and cause ``robots``); each later
plan puts the source's robots dead letters last seen more than a TTL ago back in the queue
(``collector.run.robots_replan``), so a page the site allows again is fetched. ``Crawl-delay``
is a floor under the host's pace: two requests of this engine to the host are at least that
many seconds apart (per worker; the shared ``per_domain_rate`` is the cross-worker limit).

With a shared store (:class:`RedisRobotsStore`, used when the frontier or the rate storage is
on Redis), the fetched file is kept in Redis for the TTL and every worker of the source uses
it: one fetch per host and TTL for all of them. Redis away: each worker fetches for itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from protego import Protego

from collector import defaults

__all__ = [
    "MAX_BYTES",
    "STALE_KEEP_S",
    "MemoryRobotsStore",
    "RedisRobotsStore",
    "Robots",
    "RobotsFile",
    "RobotsPolicy",
    "RobotsStore",
    "Verdict",
    "origin_of",
]

_log = logging.getLogger(__name__)

MAX_BYTES = 512 * 1024  # Google reads the first 500 KiB of a robots.txt; so do we (about)
STALE_KEEP_S = 30 * 86_400.0  # a kept copy stands in for an unreachable robots.txt this long
NO_ANSWER_RETRY_S = 60.0  # robots.txt got no answer: the pages go on, asked again after this

Kind = Literal["rules", "allow_all", "unreachable", "no_answer"]
Fetcher = Callable[[str], Awaitable[tuple[int | None, bytes]]]
"""``fetch(robots_url) -> (status or None when no answer came, body)``, given by the engine."""


@dataclass(frozen=True, slots=True)
class RobotsFile:
    """What one fetch of an origin's robots.txt found, and when."""

    kind: Kind
    fetched_at: float
    body: str = ""  # the rules' text (kind "rules")
    status: int | None = None  # the HTTP status, None when no answer came

    def to_json(self) -> str:
        return json.dumps([self.kind, self.fetched_at, self.body, self.status])

    @classmethod
    def from_json(cls, text: str | bytes) -> RobotsFile:
        kind, fetched_at, body, status = json.loads(text)
        return cls(kind, float(fetched_at), body, status)


def classify(status: int | None, body: bytes, now: float) -> RobotsFile:
    """An answer to a robots.txt request as RFC 9309 reads it (see the module docstring)."""
    if status is not None and 200 <= status < 300:
        return RobotsFile("rules", now, body[:MAX_BYTES].decode("utf-8", "replace"), status)
    if status is not None and 400 <= status < 500 and status != 429:
        return RobotsFile("allow_all", now, "", status)
    if status is None:
        return RobotsFile("no_answer", now, "", None)
    return RobotsFile("unreachable", now, "", status)


@dataclass(frozen=True, slots=True)
class Verdict:
    """May this URL be fetched now? ``held_until``: not before then (robots.txt unreachable)."""

    allowed: bool
    held_until: float | None = None
    crawl_delay_s: float | None = None
    why: str = ""


_ALLOWED = Verdict(True)


@dataclass(frozen=True, slots=True)
class RobotsPolicy:
    """How an engine obeys robots.txt (``politeness.robots: obey``): each file is kept
    ``ttl_s``, an unreachable one holds its host's pages ``unreachable_s``, and ``store``
    shares fetched files between the source's workers (None: this worker's memory). The
    engine builds its :class:`Robots` from it, fetching through its own clients."""

    ttl_s: float = defaults.ROBOTS_TTL_S
    unreachable_s: float = defaults.ROBOTS_UNREACHABLE_S
    store: RobotsStore | None = None


class RobotsStore(Protocol):
    """Where fetched robots.txt files are kept between fetches (per source)."""

    async def get(self, origin: str) -> RobotsFile | None: ...

    async def put(self, origin: str, found: RobotsFile, ttl_s: float) -> None: ...

    async def aclose(self) -> None: ...


class MemoryRobotsStore:
    """Kept in this worker only (the default)."""

    def __init__(self) -> None:
        self._files: dict[str, RobotsFile] = {}

    async def get(self, origin: str) -> RobotsFile | None:
        return self._files.get(origin)

    async def put(self, origin: str, found: RobotsFile, ttl_s: float) -> None:
        self._files[origin] = found

    async def aclose(self) -> None:
        return None


class RedisRobotsStore:
    """Kept in Redis for every worker of the source (``collector:robots:<source>:<origin>``),
    each file with the TTL's expiry plus a stale copy's keep time. Redis away: None (fetch)."""

    def __init__(self, url: str, source: str) -> None:
        import redis.asyncio as aioredis

        from collector.fetch.shared_redis import REDIS_DOWN, client_options

        self.prefix = f"collector:robots:{source}:"
        self._down = REDIS_DOWN
        self._client = aioredis.Redis.from_url(url, **client_options())

    async def get(self, origin: str) -> RobotsFile | None:
        try:
            raw = await self._client.get(self.prefix + origin)
        except self._down:
            return None
        return None if raw is None else RobotsFile.from_json(raw)

    async def put(self, origin: str, found: RobotsFile, ttl_s: float) -> None:
        keep_s = max(1, int(ttl_s + STALE_KEEP_S))
        try:
            await self._client.set(self.prefix + origin, found.to_json(), ex=keep_s)
        except self._down:
            return

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(slots=True)
class _Host:
    """One origin's file as read here: its parser, and the pace ``Crawl-delay`` sets."""

    found: RobotsFile
    parser: Protego | None
    next_slot: float = 0.0  # monotonic time the next request may go (Crawl-delay)
    held_until: float = 0.0  # wall clock: unreachable, try the file again then
    stale: RobotsFile | None = field(default=None)


def origin_of(url: str) -> str:
    """``scheme://netloc`` of an absolute URL, lower-cased, without userinfo."""
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    return f"{scheme.lower()}://{netloc.lower()}"


class Robots:
    """One engine's robots.txt answers, per origin (see the module docstring)."""

    def __init__(
        self,
        *,
        user_agent: str,
        ttl_s: float,
        unreachable_s: float,
        fetch: Fetcher,
        store: RobotsStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.user_agent = user_agent
        self.ttl_s = ttl_s
        self.unreachable_s = unreachable_s
        self._fetch = fetch
        self.store: RobotsStore = store or MemoryRobotsStore()
        self.clock = clock
        self._hosts: dict[str, _Host] = {}
        self._pending: dict[str, asyncio.Future[_Host]] = {}
        self.fetched = 0  # robots.txt requests this engine sent
        self.disallowed = 0  # URLs refused by the rules

    async def verdict(self, url: str) -> Verdict:
        """Whether ``url`` may be fetched, fetching its origin's robots.txt when due."""
        origin = origin_of(url)
        host = self._hosts.get(origin)
        if host is None or self._due(host, self.clock()):
            host = await self._host(origin)  # (a file in hand and not due: what it returns)
        found = host.found
        if found.kind in ("unreachable", "no_answer"):
            if host.stale is not None:
                found = host.stale  # the copy kept from before stands in
            elif found.kind == "unreachable":
                why = f"robots.txt unreachable (HTTP {found.status})"
                return Verdict(False, host.held_until, None, why)
        if found.kind in ("allow_all", "no_answer") or host.parser is None:
            return _ALLOWED
        delay = host.parser.crawl_delay(self.user_agent)
        if host.parser.can_fetch(url, self.user_agent):
            return Verdict(True, None, delay)
        self.disallowed += 1
        return Verdict(False, None, delay, f"disallowed by robots.txt for {self.user_agent!r}")

    def crawl_delay_s(self, url: str) -> float | None:
        """The ``Crawl-delay`` known for ``url``'s origin (None: none, or not read yet)."""
        host = self._hosts.get(origin_of(url))
        if host is None or host.parser is None:
            return None
        delay = host.parser.crawl_delay(self.user_agent)
        return None if delay is None else float(delay)

    async def pace(self, url: str, *, latest: float) -> bool:
        """Wait for ``url``'s host's next ``Crawl-delay`` slot; False (nothing waited, no slot
        taken) when that slot is after ``latest`` (monotonic): the caller gives the item back."""
        host = self._hosts.get(origin_of(url))
        if host is None or host.parser is None:
            return True
        delay = host.parser.crawl_delay(self.user_agent)
        if not delay:
            return True
        delay = float(delay)
        now = time.monotonic()
        slot = max(now, host.next_slot)
        if slot > latest:
            return False
        host.next_slot = slot + delay
        if slot > now:
            await asyncio.sleep(slot - now)
        return True

    async def _host(self, origin: str) -> _Host:
        """The origin's file, fetched by the first caller that needs it; the others wait for
        that fetch. A waiter whose fetcher was cancelled (a stop, a batch cut off) or failed
        fetches itself, so no page is failed by another page's cancellation."""
        while True:
            host = self._hosts.get(origin)
            now = self.clock()
            if host is not None and not self._due(host, now):
                return host
            pending = self._pending.get(origin)
            if pending is None:
                break
            await asyncio.wait({pending})  # raises only when this task itself is cancelled
            if not pending.cancelled() and pending.exception() is None:
                return pending.result()
        future: asyncio.Future[_Host] = asyncio.get_running_loop().create_future()
        self._pending[origin] = future
        try:
            fresh = await self._load(origin, host, now)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # retrieved: nobody logs it as lost
            else:
                future.cancel()
            raise
        else:
            self._hosts[origin] = fresh
            future.set_result(fresh)
            return fresh
        finally:
            del self._pending[origin]

    def _due(self, host: _Host, now: float) -> bool:
        if host.found.kind in ("unreachable", "no_answer"):
            return now >= host.held_until
        return now >= host.found.fetched_at + self.ttl_s

    async def _load(self, origin: str, before: _Host | None, now: float) -> _Host:
        """The origin's file from the shared store when one there is young enough, else
        fetched (and put there)."""
        shared = await self.store.get(origin)
        if shared is not None and self._young(shared, now):
            found = shared
        else:
            status, body = await self._fetch(origin + "/robots.txt")
            self.fetched += 1
            found = classify(status, body, self.clock())
            await self.store.put(origin, found, self.ttl_s)
            if found.kind == "unreachable":
                _log.warning(
                    "%s/robots.txt: HTTP %s; its pages wait %g s (politeness.robots)",
                    origin, status, self.unreachable_s,
                )  # fmt: skip
        stale = None
        failed = ("unreachable", "no_answer")
        if found.kind in failed:
            kept = shared if shared is not None and shared.kind not in failed else None
            if kept is None and before is not None:
                kept = before.stale if before.found.kind in failed else before.found
            if kept is not None and now - kept.fetched_at < STALE_KEEP_S:
                stale = kept
        rules = stale if stale is not None else found
        parser = Protego.parse(rules.body) if rules.kind == "rules" else None
        host = _Host(found, parser, stale=stale)
        if before is not None:
            host.next_slot = before.next_slot  # the pace goes on across refetches
        if found.kind == "unreachable":
            host.held_until = found.fetched_at + self.unreachable_s
        elif found.kind == "no_answer":
            host.held_until = found.fetched_at + NO_ANSWER_RETRY_S
        return host

    def _young(self, found: RobotsFile, now: float) -> bool:
        if found.kind == "unreachable":
            return now < found.fetched_at + self.unreachable_s
        if found.kind == "no_answer":
            return now < found.fetched_at + NO_ANSWER_RETRY_S
        return now < found.fetched_at + self.ttl_s
