"""Redis frontier: the shared backend for workers on several machines.

It behaves exactly like :class:`collector.frontier.sqlite.SqliteFrontier` (the conformance suite
is the contract; a differential test compares the two on random call sequences). Every state
change is one Lua script (``collector/frontier/lua/``), atomic and serialised with every other
client's, and no script reads Redis' clock: every time is the caller's ``now``. A source's keys
share one Cluster hash tag; records are found by a 100-bit digest of the URL, so one copy of
each URL is all the memory target allows. Calls are one EVALSHA each (an offer two per chunk:
Python decides, the script applies only to unchanged records), and a state-changing call whose
reply was lost is resent with its request id and answered from its recorded reply, so it runs
once. The key layout, round trips, memory per URL and limits: docs/frontier-redis.md.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar

import redis
from redis.exceptions import RedisError

from collector._closing import Closing
from collector._redis import Scripts, backend_error, client_for, resending
from collector.errors import BackendError
from collector.frontier.base import (
    STATES,
    AckResult,
    ClaimedItem,
    Completed,
    DeadLettered,
    FreshFor,
    Holder,
    Lease,
    Offer,
    OfferResult,
    Outcome,
    PageHistory,
    RankFor,
    RetryLater,
    StateCounts,
    StoredRow,
    SweepResult,
    plan_decision,
)

__all__ = ["RedisFrontier"]

_T = TypeVar("_T")

_CHUNK = 500  # URLs per offer script: bounded script run time, few round trips
# queue index members read by one adopt or sweep script: a page of a large leftover queue holds
# Redis for milliseconds, not the ~50 s one script took for a million items
_PAGE = 2_000
_MAX_OFFER_ROUNDS = 100  # re-decisions of one chunk under contention before giving up
# The scripts, in lua/<name>.lua, each run after lua/prelude.lua (key names, record access,
# counters, queue and expiry indexes). Every file says its KEYS, ARGV and reply.
_SCRIPTS = (
    "claim",
    "beat",
    "holders",
    "revoke",
    "ack",
    "renew",
    "release",
    "requeue",
    "make_stale",
    "revive",
    "offer_read",
    "offer_apply",
    "counts",
    "next_event",
    "sweep",
    "adopt_tag",
    "due_read",
    "sweep_due",
    "unlist",
    "renew_queue_ttl",
)
# What a resend may do when a reply was lost (collector._redis): these record their reply under a
# request id (B:req:<id>) and return it to a resend of the same call without running again ...
_REPLAYED = frozenset(
    {"claim", "revoke", "ack", "renew", "release", "requeue", "make_stale", "revive",
     "offer_apply", "sweep", "adopt_tag", "sweep_due", "unlist", "renew_queue_ttl"}
)  # fmt: skip
# ... these read, or write what a second run writes again and answer the same (beat: a heartbeat;
# due_read drops only index entries of items that moved on): sent again as they are.
_RESENT = frozenset({"beat", "holders", "offer_read", "counts", "next_event", "due_read"})


def _chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _num(value: float) -> str:
    """A float as text that reads back as the same double (Lua's tonumber, Redis scores)."""
    return repr(float(value))


class RedisFrontier(Closing):
    """Frontier in a Redis database, shared by every worker that uses the same URL and prefix.

    ``url_or_client`` is a ``redis://`` / ``rediss://`` / ``unix://`` URL (this object then owns
    the connection pool and :meth:`close` closes it) or an existing ``redis.Redis`` client
    (left open by :meth:`close`). Construction pings the server, so a wrong URL fails here.
    """

    def __init__(
        self, url_or_client: str | redis.Redis, *, prefix: str = "collector", page: int = _PAGE
    ) -> None:
        self.prefix = prefix
        self.page = page  # members of the queue indexes one adopt or sweep script reads
        self._token_key = f"{prefix}:fencing_token"
        self._client, self.url, self._owns_client = client_for(url_or_client, what="frontier")
        # The highest token this object has been given. A claim that starts after it was handed
        # out must get a higher one; a lower one means the counter was lost (see claim()).
        self._max_token = 0
        self._token_lock = threading.Lock()
        try:
            self._scripts = Scripts(
                self._client, __package__, _SCRIPTS, replayed=_REPLAYED, resent=_RESENT
            )
        except RedisError as exc:
            self._close_owned()
            raise backend_error(f"frontier {self.url}: cannot connect", exc) from exc

    def __repr__(self) -> str:
        return f"RedisFrontier({self.url!r}, prefix={self.prefix!r})"

    def location(self) -> str:
        return f"{self.url} (prefix {self.prefix!r})"

    def _base(self, source: str) -> str:
        return "{" + f"{self.prefix}:{source}" + "}"

    def _run(self, what: str, name: str, source: str, args: Sequence[Any]) -> Any:
        base = self._base(source)
        keys = [base]
        if name == "claim":
            keys.append(self._token_key)
        try:
            return self._scripts(name, keys, args, records=f"{base}:req:")
        except RedisError as exc:
            raise backend_error(f"frontier {self.url}: {what} failed", exc) from exc

    # --- planning --------------------------------------------------------------------------
    def offer(
        self,
        source: str,
        offers: Iterable[Offer],
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        run_id: str,
        once_per_run: bool = False,
    ) -> OfferResult:
        result = OfferResult()
        # a URL offered twice in one call is queued once; with once_per_run the run tag says so
        seen: set[str] = set()
        head = [_num(now), _num(now + queue_ttl_s), run_id]
        for chunk in _chunks(offers, _CHUNK):
            pending: list[Offer] = []
            planned = set() if once_per_run else seen
            for o in chunk:
                if o.url in planned:
                    if once_per_run:
                        result.duplicates += 1
                    else:
                        result.already_queued += 1
                else:
                    planned.add(o.url)
                    pending.append(o)
            rounds = 0
            while pending:
                rounds += 1
                if rounds > _MAX_OFFER_ROUNDS:
                    raise BackendError(
                        f"frontier {self.url}: offer failed: records kept changing under "
                        f"{len(pending)} URLs of source {source!r}"
                    )
                urls = json.dumps([o.url for o in pending], ensure_ascii=False)
                read = json.loads(self._run("offer", "offer_read", source, [urls, run_id]))
                flat: list[str] = []
                actions: list[str] = []
                for o, version, state_no, fresh_until, fetched, ours in zip(
                    pending,
                    read[::5],
                    read[1::5],
                    read[2::5],
                    read[3::5],
                    read[4::5],
                    strict=True,
                ):
                    if once_per_run and ours:
                        actions.append("duplicate")
                        continue
                    row = (
                        StoredRow(
                            STATES[state_no - 1],
                            float(fresh_until) if fresh_until else None,
                            float(fetched) if fetched else None,
                        )
                        if version
                        else None
                    )
                    action = plan_decision(row, now)
                    actions.append(action)
                    if action == "enqueue":
                        score = _num(-rank_for(o.url, None, o.fresh_s))
                        flat += ("n", o.url, "", score)
                    elif action == "requeue":
                        last = row.last_fetched_at if row else None
                        age = None if last is None else now - last
                        flat += ("r", o.url, version, _num(-rank_for(o.url, age, o.fresh_s)))
                    else:
                        flat += ("t", o.url, version, "")
                conflicts: set[int] = set()
                if flat:
                    args = [*head, json.dumps(flat, ensure_ascii=False)]
                    applied = self._run("offer", "offer_apply", source, args)
                    # positions in flat (the applied ones) back to positions in pending
                    sent = [n for n, done in enumerate(actions) if done != "duplicate"]
                    conflicts = {sent[int(i) - 1] for i in applied}
                for n, done in enumerate(actions):
                    if n in conflicts:
                        continue
                    if done in ("enqueue", "requeue"):
                        result.enqueued += 1
                    elif done == "fresh":
                        result.fresh_skipped += 1
                    elif done == "already_queued":
                        result.already_queued += 1
                    elif done == "duplicate":
                        result.duplicates += 1
                    else:
                        result.already_dead += 1
                pending = [pending[n] for n in sorted(conflicts)]
        return result

    def sweep(self, source: str, run_id: str, *, retire: bool) -> SweepResult:
        result = SweepResult()
        for carried, retired in self._tag_pages("sweep", source, [run_id, "1" if retire else "0"]):
            result.carried += carried
            result.retired += retired
        ki, pos = 1, 0
        while ki <= 2:  # done and expired items the list dropped: marked unlisted, a page a call
            ki, pos = (
                int(v)
                for v in self._run("sweep", "sweep_due", source, [run_id, ki, pos, self.page])
            )
        return result

    def unlist(self, source: str, urls: Iterable[str], run_id: str, *, retire: bool) -> SweepResult:
        result = SweepResult()
        flag = "1" if retire else "0"
        for chunk in _chunks(urls, _CHUNK):
            packed = json.dumps(chunk, ensure_ascii=False)
            carried, retired = self._run("unlist", "unlist", source, [run_id, flag, packed])
            result.carried += int(carried)
            result.retired += int(retired)
        return result

    def renew_queue_ttl(self, source: str, *, now: float, queue_ttl_s: float) -> int:
        renewed, left = 0, 1
        while left:  # a page of expiry entries per script
            args = [_num(now), _num(now + queue_ttl_s), self.page]
            done, left = (int(v) for v in self._run("renew", "renew_queue_ttl", source, args))
            renewed += done
        return renewed

    def _tag_pages(self, script: str, source: str, args: list[str]) -> Iterator[list[int]]:
        """Run ``script`` (adopt_tag or sweep) a page at a time until no queued or leased item is
        left untagged; yields each page's counts (tagged; or carried and retired).

        Each page is atomic, the walk is not: a claim, ack or release between two pages moves
        items between the sorted sets the pages read by position, so the walk may pass over
        some. The script returns how many are still left (exact, from the counters), and the
        walk goes round again until none is: every item queued or leased when the walk ends is
        the run's, however helpers moved items meanwhile.
        """
        ki, pos, idle_rounds, changed = 1, 0, 0, 0
        while True:
            reply = [int(v) for v in self._run(script, script, source, [*args, ki, pos, self.page])]
            *counts, ki, pos, left = reply
            yield counts
            changed += sum(counts)
            if left <= 0:
                return
            if ki > 3:  # a round over leased, queued and delayed items is done: go round again
                idle_rounds = 0 if changed else idle_rounds + 1
                if idle_rounds >= 3:
                    raise BackendError(
                        f"frontier {self.url}: {script} failed: the counters of source "
                        f"{source!r} say {left} queued or leased items are not tagged yet, but "
                        "the queue indexes hold none of them"
                    )
                ki, pos, changed = 1, 0, 0

    def adopt(
        self,
        source: str,
        run_id: str,
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        fresh_for: FreshFor,
    ) -> OfferResult:
        result = OfferResult()
        for (tagged,) in self._tag_pages("adopt_tag", source, [run_id]):
            result.already_queued += tagged
        while True:
            args = [_num(now), _CHUNK, run_id]
            urls = json.loads(self._run("adopt", "due_read", source, args))
            if not urls:
                return result
            part = self.offer(
                source,
                [Offer(url, fresh_for(url)) for url in urls],
                now=now,
                queue_ttl_s=queue_ttl_s,
                rank_for=rank_for,
                run_id=run_id,
                once_per_run=True,
            )
            result.enqueued += part.enqueued
            result.already_queued += part.already_queued
            result.fresh_skipped += part.fresh_skipped
            result.already_dead += part.already_dead

    def plan_mark(self, source: str) -> str | None:
        key = self._base(source) + ":plan"
        try:
            mark = resending(self._client, lambda: self._client.get(key))
        except RedisError as exc:
            raise backend_error(f"frontier {self.url}: plan mark failed", exc) from exc
        if isinstance(mark, bytes):
            return mark.decode("utf-8")
        return None if mark is None else str(mark)

    def set_plan_mark(self, source: str, mark: str | None) -> None:
        key = self._base(source) + ":plan"
        try:
            if mark is None:
                resending(self._client, lambda: self._client.delete(key))
            else:
                resending(self._client, lambda: self._client.set(key, mark))
        except RedisError as exc:
            raise backend_error(f"frontier {self.url}: plan mark failed", exc) from exc

    # --- claiming --------------------------------------------------------------------------
    def claim(
        self, source: str, limit: int, *, now: float, lease_s: float, holder: str = ""
    ) -> Lease:
        expires_at = now + lease_s
        args = [_num(now), _num(expires_at), max(int(limit), 0), holder]
        floor = self._max_token
        token, reclaimed, expired, packed = self._run("claim", "claim", source, args)
        token = int(token)
        with self._token_lock:
            self._max_token = max(self._max_token, token)
        if token <= floor:
            # A Redis that restarted without persistence starts the counter again at 1; going
            # on would hand out tokens older than ones already in use. The items of this claim
            # stay leased to nobody until the lease expires.
            raise BackendError(
                f"frontier {self.url}: claim failed: fencing token went back from {floor} to "
                f"{token}; the Redis lost its data (restarted without persistence?)"
            )
        flat = json.loads(packed) if packed else []
        items = tuple(
            ClaimedItem(
                u,
                int(att),
                float(first) if first else None,
                float(enq),
                etag or None,
                lm or None,
                PageHistory.decode(hist),
            )
            for u, att, first, enq, etag, lm, hist in zip(
                *(flat[i::7] for i in range(7)), strict=True
            )
        )
        return Lease(
            source,
            token,
            expires_at,
            items,
            expired=int(expired),
            reclaimed=int(reclaimed),
            holder=holder,
        )

    def beat(self, source: str, holder: str, *, now: float) -> None:
        self._run("heartbeat", "beat", source, [holder, _num(now)])

    def holders(self, source: str) -> list[Holder]:
        flat = self._run("holders", "holders", source, [])
        return [
            Holder(_text(h), int(n), float(beat) if beat else None)
            for h, n, beat in zip(flat[::3], flat[1::3], flat[2::3], strict=True)
        ]

    def revoke(self, source: str, holder: str, *, now: float) -> int:
        return int(self._run("revoke", "revoke", source, [holder, _num(now)]))

    def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        args = [lease.token, _num(now + lease_s), *(i.url for i in lease.items)]
        return int(self._run("renew", "renew", lease.source, args))

    def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        flat: list[Any] = []
        for o in outcomes:
            if isinstance(o, Completed):
                flat += (
                    "c",
                    o.url,
                    _num(o.fresh_until),
                    _num(o.fetched_at),
                    _num(o.cost),
                    o.etag or "",
                    o.last_modified or "",
                    "" if o.history is None else o.history.encode(),
                )
            elif isinstance(o, RetryLater):
                flat += (
                    "r",
                    o.url,
                    _num(o.not_before),
                    _num(o.rank),
                    str(int(o.attempts)),
                    _num(o.first_attempt_at),
                    o.error,
                )
            elif isinstance(o, DeadLettered):
                flat += ("d", o.url, str(int(o.attempts)), o.error)
            else:  # pragma: no cover - the type union is closed
                raise TypeError(f"unknown outcome {o!r}")
        if not outcomes:
            return AckResult()
        args = [lease.token, _num(now), json.dumps(flat, ensure_ascii=False)]
        reply = self._run("ack", "ack", lease.source, args)
        return AckResult(int(reply[0]), [outcomes[int(i) - 1].url for i in reply[1:]])

    def release(self, lease: Lease, *, now: float) -> int:
        args = [lease.token, _num(now), *(i.url for i in lease.items)]
        return int(self._run("release", "release", lease.source, args))

    def requeue(self, source: str, urls: Sequence[str], *, now: float, queue_ttl_s: float) -> int:
        if not urls:
            return 0
        args = [_num(now), _num(now + queue_ttl_s), *urls]
        return int(self._run("requeue", "requeue", source, args))

    def revive(self, source: str, pages: Sequence[Completed]) -> int:
        if not pages:
            return 0
        flat: list[Any] = []
        for p in pages:
            flat += (p.url, _num(p.fresh_until), _num(p.fetched_at), _num(p.cost))
        args = [json.dumps(flat, ensure_ascii=False)]
        return int(self._run("revive", "revive", source, args))

    def make_stale(self, source: str, urls: Sequence[str]) -> int:
        if not urls:
            return 0
        return int(self._run("make_stale", "make_stale", source, list(urls)))

    # --- reading ---------------------------------------------------------------------------
    def _counts(self, what: str, source: str, run_id: str | None) -> StateCounts:
        args = [""] if run_id is None else ["run", run_id]
        reply = self._run(what, "counts", source, args)
        counts = StateCounts()
        for i in range(0, len(reply), 2):
            n = int(reply[i + 1])
            if n:
                setattr(counts, STATES[int(reply[i]) - 1], n)
        return counts

    def histories(self, source: str) -> Iterator[tuple[str, PageHistory]]:
        key = self._base(source) + ":hist"
        cursor = 0

        def page_at(at: int) -> tuple[int, dict[Any, Any]]:
            found: Any = self._client.hscan(key, at, count=1000)
            return int(found[0]), dict(found[1])

        while True:
            try:
                cursor, page = resending(self._client, functools.partial(page_at, cursor))
            except RedisError as exc:
                raise backend_error(f"frontier {self.url}: histories failed", exc) from exc
            for url, text in page.items():
                history = PageHistory.decode(text)
                if history is not None:
                    yield _text(url), history
            if cursor == 0:
                return

    def counts(self, source: str) -> StateCounts:
        return self._counts("counts", source, None)

    def run_counts(self, source: str, run_id: str) -> StateCounts:
        return self._counts("run counts", source, run_id)

    def due_count(self, source: str, *, now: float) -> int:
        # queued from the kept counts; the due index counted, not read (ZCOUNT is O(log n)):
        # its entries of items that moved on are dropped lazily (due_read), so it may count more
        base = self._base(source)
        queued = self.counts(source).queued
        client = self._client
        try:
            expired = resending(client, lambda: client.zcard(f"{base}:e"))
            stale = resending(client, lambda: client.zcount(f"{base}:f", "-inf", _num(now)))
        except RedisError as exc:
            raise backend_error(f"frontier {self.url}: due count failed", exc) from exc
        return queued + int(expired) + int(stale)

    def next_event_at(self, source: str, *, now: float) -> float | None:
        reply = self._run("next event", "next_event", source, [_num(now)])
        return None if reply is None else float(reply)

    def close(self) -> None:
        self._close_owned()

    def _close_owned(self) -> None:
        if self._owns_client:
            try:
                self._client.close()
                self._client.connection_pool.disconnect()
            except RedisError:  # closing a pool to a dead server is not an error
                pass
