"""Per-host circuit breakers: stop sending to a host that keeps failing, probe it later.

A host's breaker is *closed* (requests go), *open* (none go until its cool-down ends) or
*half-open* (the cool-down ended: up to ``probes`` requests go at once; the first success
closes it, a failure opens it again with a longer cool-down). It opens on ``failures``
consecutive recoverable failures (refused connections, timeouts, 5xx, 429) or on a failure
ratio over the last ``window`` responses. Cool-downs grow by ``cooldown_factor`` with each
re-opening, up to ``cooldown_max_s``, with jitter so that many workers do not probe at once.

While a host's breaker is open the engine sends nothing to it: its items go back to the queue
*deferred* until the breaker may let probes through (not an attempt, not a retry, never a dead
letter), so a 20-minute outage costs a few requests per cool-down instead of every item's
retries.

Why not a library: pybreaker, purgatory and aiobreaker wrap a *call* (``breaker.call(f)``) and
raise when open; none has a failure ratio window, growing cool-downs with jitter and a bounded
number of concurrent half-open probes together, and the engine needs to ask "when may this host
be tried again?" to defer items rather than fail them. pybreaker's shared state is a synchronous
Redis client (it would block the event loop), purgatory's Redis store keeps only a fixed TTL and
one probe. The state machine is small (below); the part worth sharing, the opening, lives in a
:class:`CircuitStore`: in memory for one worker, or in Redis (:class:`RedisCircuitStore`) so
that when one worker learns a host is down, every worker of the source stops sending to it.

What is shared and what is not: the *opening* (epoch, how many times in a row, until when) and
the half-open probe slots are in the store; failure counting is per worker (each worker trips
the shared breaker on its own evidence, and a trip already made by another is not repeated).
Ctrl-C, cancel or SIGKILL lose nothing: deferred items are in the frontier with a not-before
time, and a Redis breaker's key expires on its own an hour after its cool-down.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from collector import defaults

if TYPE_CHECKING:
    from collector.config import CircuitSettings

__all__ = [
    "Admission",
    "CircuitBoard",
    "CircuitListener",
    "CircuitStore",
    "HostCircuit",
    "MemoryCircuitStore",
    "RedisCircuitStore",
    "Snapshot",
]

CircuitListener = Callable[[str, dict[str, Any]], None]
"""``(kind, data)`` with kind ``opened`` or ``closed``: how the flow learns of transitions."""

_KEY_TTL_S = 3600.0  # a shared breaker's key outlives its cool-down by this much
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _Unanswered(enum.Enum):
    """Redis did not answer (down, restarting): the store answers from the worker's state."""

    UNANSWERED = enum.auto()


_UNANSWERED: Final = _Unanswered.UNANSWERED


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A host's breaker as stored: ``opens`` 0 means closed; else open until ``until``."""

    epoch: int = 0  # incremented at every opening: tells one opening from the next
    opens: int = 0  # openings in a row without a successful probe (0: closed)
    until: float = 0.0  # wall-clock time after which probes may go (open -> half-open)

    @property
    def closed(self) -> bool:
        return self.opens == 0


@dataclass(frozen=True, slots=True)
class Admission:
    """What the breaker says about one request: go (``probe`` when half-open) or defer.

    A request let through while closed carries ``seq``, its place in the host's send order:
    the outcome given to :meth:`CircuitBoard.record` is placed there, so "consecutive" means
    consecutive as sent, not as answered.
    """

    go: bool
    probe_epoch: int | None = None  # set for a half-open probe
    not_before: float = 0.0  # wall-clock time to come back, when deferred
    seq: int | None = None  # set for a request let through while closed


GO = Admission(True)


def cooldown_s(settings: CircuitSettings, opens: int, draw: float) -> float:
    """The cool-down of the ``opens``-th opening in a row; ``draw`` in [0, 1) sets its jitter."""
    base = settings.cooldown_s * settings.cooldown_factor ** max(opens - 1, 0)
    base = min(base, settings.cooldown_max_s)
    return base * (1 + settings.jitter * (2 * draw - 1))


class CircuitStore(Protocol):
    """Where breakers live: ``trip`` is the only transition that must be atomic across workers."""

    async def read(self, host: str) -> Snapshot: ...

    async def trip(
        self, host: str, seen_epoch: int, now: float, draw: float
    ) -> tuple[Snapshot, bool]:
        """Open (or re-open) ``host`` unless another trip happened since ``seen_epoch``.

        Returns the breaker as it is now and whether this call opened it.
        """
        ...

    async def take_probe(self, host: str, epoch: int, round_: int) -> bool:
        """One of the ``probes`` half-open slots of (epoch, round), if one is left."""
        ...

    async def close(self, host: str, epoch: int) -> bool:
        """Close ``host`` if still at ``epoch``; True when this call closed it."""
        ...

    async def aclose(self) -> None: ...


class MemoryCircuitStore:
    """Breakers of one worker (one process).

    ``state`` (host -> snapshot) may be a dict the caller keeps: :class:`RedisCircuitStore`
    answers from its last snapshots this way while Redis is away.
    """

    def __init__(
        self, settings: CircuitSettings, *, state: dict[str, Snapshot] | None = None
    ) -> None:
        self.settings = settings
        self._state: dict[str, Snapshot] = {} if state is None else state
        self._probes: dict[str, tuple[int, int, int]] = {}  # host -> (epoch, round, taken)

    async def read(self, host: str) -> Snapshot:
        return self._state.get(host, _CLOSED)

    async def trip(
        self, host: str, seen_epoch: int, now: float, draw: float
    ) -> tuple[Snapshot, bool]:
        current = self._state.get(host, _CLOSED)
        if current.epoch != seen_epoch:
            return current, False
        opens = current.opens + 1
        tripped = Snapshot(current.epoch + 1, opens, now + cooldown_s(self.settings, opens, draw))
        self._state[host] = tripped
        return tripped, True

    async def take_probe(self, host: str, epoch: int, round_: int) -> bool:
        seen_epoch, seen_round, taken = self._probes.get(host, (-1, -1, 0))
        if (seen_epoch, seen_round) != (epoch, round_):
            taken = 0
        if taken >= self.settings.probes:
            return False
        self._probes[host] = (epoch, round_, taken + 1)
        return True

    async def close(self, host: str, epoch: int) -> bool:
        current = self._state.get(host, _CLOSED)
        if current.closed or current.epoch != epoch:
            return False
        self._state[host] = Snapshot(current.epoch, 0, 0.0)
        return True

    async def aclose(self) -> None:
        return None


_CLOSED = Snapshot()


class RedisCircuitStore:
    """Breakers shared by every worker of a source, in Redis (``collector:circuit:<source>:*``).

    One hash per host (epoch, opens, until) changed by Lua scripts (``collector/fetch/lua/``,
    asyncio client, so not collector._redis.Scripts, which is synchronous), so two workers tripping
    at once open it once; half-open probe slots are a counter per (epoch, round).

    **While Redis is away** (a restart, a network blip) the breakers do not stop the fetch loop
    and do not fail items: a breaker is advice about a host, not a record. A call that fails
    answers from this worker's own state instead, kept in a :class:`MemoryCircuitStore` that
    starts from the last snapshot seen of each host (so an open breaker stays open), and Redis
    is tried again after a backoff (:func:`collector.fetch.shared_redis.backoff`), not on every
    call. Nothing is replayed on Redis: a call whose reply was lost may have run there, and the
    next read shows what it did. When Redis answers again, its state is read and wins, except
    that a host this worker opened during the outage and that is still open here is opened in
    Redis too (a trip from the epoch read), so the other workers learn of it. The outage and
    the recovery are logged once each, as one line.
    """

    def __init__(self, url: str, source: str, settings: CircuitSettings) -> None:
        import redis.asyncio as aioredis

        from collector._redis import describe_url, lua_source
        from collector.fetch.shared_redis import REDIS_DOWN, backoff, client_options

        self.settings = settings
        self.source = source
        self._down_errors = REDIS_DOWN
        self.prefix = f"collector:circuit:{source}:"
        self.where = describe_url(url)
        self._client = aioredis.Redis.from_url(url, **client_options())
        self._trip = self._client.register_script(
            lua_source("collector.fetch", None, "circuit_trip")
        )
        self._close = self._client.register_script(
            lua_source("collector.fetch", None, "circuit_close")
        )
        self._known: dict[str, Snapshot] = {}  # last snapshot seen per host, shared or local
        self._local = MemoryCircuitStore(settings, state=self._known)
        self._opened_locally: set[str] = set()  # hosts to open in Redis when it answers again
        self._backoff = backoff()
        self._down_since: float | None = None  # monotonic; None: Redis answered last time
        self._failures = 0
        self._retry_at = 0.0  # monotonic: Redis is not tried again before this while down

    @property
    def down(self) -> bool:
        """Whether Redis failed the last call (answers come from this worker's state)."""
        return self._down_since is not None

    async def _shared(self, call: Callable[[], Awaitable[_T]]) -> _T | _Unanswered:
        """``call()`` on Redis, or :data:`_UNANSWERED` when it is down (tried again later)."""
        now = time.monotonic()
        if self._down_since is not None:
            if now < self._retry_at:
                return _UNANSWERED
            # One call tries Redis; the others keep answering locally meanwhile.
            self._retry_at = now + self._backoff.compute(self._failures + 1)
        try:
            result = await call()
        except self._down_errors as exc:
            self._failed(exc)
            return _UNANSWERED
        if self._down_since is not None:
            _log.info(
                "circuit breakers of %s: Redis %s answers again after %.1f s; shared again",
                self.source, self.where, time.monotonic() - self._down_since,
            )  # fmt: skip
            self._down_since, self._failures = None, 0
        return result

    def _failed(self, exc: BaseException) -> None:
        from collector._redis import one_line

        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            _log.warning(
                "circuit breakers of %s: Redis %s unreachable (%s); each worker keeps its own "
                "until it answers",
                self.source, self.where, one_line(exc),
            )  # fmt: skip
        self._failures += 1
        self._retry_at = now + self._backoff.compute(self._failures)

    async def read(self, host: str) -> Snapshot:
        key = self.prefix + host
        raw = await self._shared(lambda: self._client.hmget(key, ["epoch", "opens", "until"]))
        if raw is _UNANSWERED:
            return await self._local.read(host)
        shared = _CLOSED
        if raw[0] is not None:
            shared = Snapshot(int(raw[0]), int(raw[1] or 0), float(raw[2] or 0))
        if host in self._opened_locally:
            self._opened_locally.discard(host)
            mine = self._known.get(host, _CLOSED)
            if shared.closed and not mine.closed and time.time() < mine.until:
                # Opened here while Redis was away: tell the other workers now.
                shared, _ = await self.trip(host, shared.epoch, time.time(), random.random())
                return shared
        self._known[host] = shared
        return shared

    async def trip(
        self, host: str, seen_epoch: int, now: float, draw: float
    ) -> tuple[Snapshot, bool]:
        s = self.settings
        args: list[str | int | float] = [
            seen_epoch, repr(now), repr(draw), s.cooldown_s, s.cooldown_factor,
            s.cooldown_max_s, s.jitter, _KEY_TTL_S,
        ]  # fmt: skip
        reply = await self._shared(lambda: self._trip(keys=[self.prefix + host], args=args))
        if reply is _UNANSWERED:
            tripped, opened = await self._local.trip(host, seen_epoch, now, draw)
            if opened:
                self._opened_locally.add(host)
            return tripped, opened
        epoch, opens, until, opened = reply
        snapshot = Snapshot(int(epoch), int(opens), float(until))
        self._known[host] = snapshot
        return snapshot, bool(opened)

    async def take_probe(self, host: str, epoch: int, round_: int) -> bool:
        key = f"{self.prefix}{host}:probes:{epoch}:{round_}"

        async def incr() -> Any:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, int(_KEY_TTL_S))
                taken, _ = await pipe.execute()
            return taken

        taken = await self._shared(incr)
        if taken is _UNANSWERED:
            return await self._local.take_probe(host, epoch, round_)
        return int(taken) <= self.settings.probes

    async def close(self, host: str, epoch: int) -> bool:
        reply = await self._shared(lambda: self._close(keys=[self.prefix + host], args=[epoch]))
        if reply is _UNANSWERED:
            closed = await self._local.close(host, epoch)
            if closed:
                self._opened_locally.discard(host)
            return closed
        if reply:
            self._known[host] = Snapshot(epoch, 0, 0.0)
        return bool(reply)

    async def aclose(self) -> None:
        await self._client.aclose()


_FAILING_KEPT = 1_024  # failing URLs remembered per host (oldest forgotten first)


_FAILED, _OK, _REPEAT = "failed", "ok", "repeat"  # a request's outcome in the send order
_OUTCOMES_KEPT = 4_096  # outcomes remembered per host, by send order


class HostCircuit:
    """One host's breaker as one engine sees it: its failure counts and the last snapshot read
    from the store. The engine keeps it in the host's slot and asks it directly
    (:meth:`admit`, :meth:`record`, :meth:`forget`); :class:`CircuitBoard` keeps every host's
    for its listeners and :meth:`CircuitBoard.open_hosts`.

    Failures are consecutive *in the order the requests were sent*. In the order they are
    answered, a 503 that comes back in a millisecond overtakes the pages sent before it that
    take 300 ms, so a few fast failures among slow successes would look like a run, most of all
    on a loaded box; a run is therefore counted over requests whose predecessors in the send
    order have answered (a request still in flight ends the run until it answers).
    """

    __slots__ = (
        "board", "consecutive", "failing", "host", "in_flight", "next_seq", "outcomes",
        "read_at", "recent", "snapshot",
    )  # fmt: skip

    def __init__(self, board: CircuitBoard, host: str) -> None:
        self.board = board
        self.host = host
        self.consecutive = 0  # the longest run of failures, in send order, seen last
        self.recent: deque[bool] = deque(maxlen=board.settings.window)  # True: a failure
        # URLs whose last answer was a failure (insertion-ordered, bounded): a page failing
        # again is evidence about that page, not about the host
        self.failing: dict[str, None] = {}
        self.next_seq = 0
        self.in_flight: set[int] = set()
        self.outcomes: dict[int, str] = {}  # send order -> outcome (insertion-ordered)
        self.snapshot = _CLOSED
        self.read_at = -math.inf  # monotonic time of the last store read

    # --- what the engine asks ----------------------------------------------------------------
    def deferred_until(self) -> float | None:
        """Without I/O: when the breaker is known open, until when; else None."""
        snapshot = self.snapshot
        if snapshot.closed:
            return None
        return snapshot.until if self.board.clock() < snapshot.until else None

    async def admit(self) -> Admission:
        """May one request go now? Closed: yes; open: defer; half-open: a probe."""
        board = self.board
        snapshot = await self._read()
        if snapshot.closed:
            return Admission(True, seq=self._take_seq())
        now = board.clock()
        if now < snapshot.until:
            return Admission(False, not_before=snapshot.until)
        round_ = int((now - snapshot.until) // board.probe_window_s)
        if await board.store.take_probe(self.host, snapshot.epoch, round_):
            return Admission(True, probe_epoch=snapshot.epoch)
        # Half-open and the probes are out: come back once they may have answered.
        wait = min(board.settings.cooldown_s, board.probe_window_s)
        return Admission(False, not_before=now + wait * (0.5 + board.rng.random()))

    async def record(self, admission: Admission, *, failed: bool, url: str | None = None) -> None:
        """The outcome of a request :meth:`admit` let through (recoverable failure or not).

        With ``url``, a page that fails again is not counted a second time (see
        :meth:`_count`); a half-open probe's failure always re-opens.
        """
        board = self.board
        if admission.probe_epoch is not None:
            if failed:
                await self._trip(admission.probe_epoch)
            elif await board.store.close(self.host, admission.probe_epoch):
                self.snapshot = Snapshot(admission.probe_epoch, 0, 0.0)
                self.read_at = time.monotonic()
                self.reset_counts()
                board.closed += 1
                board.tell("closed", host=self.host, epoch=admission.probe_epoch)
            else:
                self.read_at = -math.inf  # someone else moved it: read again next time
            return
        if not self.snapshot.closed:
            if admission.seq is not None:
                self.forget(admission)
            return  # answered after the breaker opened: the opening already counted it
        counted = self._count(failed, url, admission.seq)
        if failed and counted and self._should_open():
            await self._trip(self.snapshot.epoch)

    def forget(self, admission: Admission) -> None:
        """``admission`` let a request through that was not sent or will not answer (too late
        for its batch, cancelled): it no longer holds back a run of failures around it."""
        if admission.seq is not None:
            self.in_flight.discard(admission.seq)

    # --- the state machine ---------------------------------------------------------------------
    async def _read(self) -> Snapshot:
        board = self.board
        if not board.shared:
            self.snapshot = await board.store.read(self.host)
        elif time.monotonic() - self.read_at >= board.sync_s:
            self.snapshot = await board.store.read(self.host)
            self.read_at = time.monotonic()
        return self.snapshot

    def _take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.in_flight.add(seq)
        return seq

    def _count(self, failed: bool, url: str | None = None, seq: int | None = None) -> bool:
        """Count one answer; False when it is a repeat failure of a page already counted.

        A site with a few pages that always answer 503 is not down: their retries, which
        crowd the tail of a batch once the good pages are done, would otherwise make
        ``failures`` consecutive failures out of one page's evidence and open the breaker on
        a host that serves every other page. During an outage distinct pages fail, so the
        breaker opens as fast as before.
        """
        repeat = False
        if url is not None:
            if failed and url in self.failing:
                repeat = True
            elif failed:
                self.failing[url] = None
                if len(self.failing) > _FAILING_KEPT:
                    del self.failing[next(iter(self.failing))]
            else:
                self.failing.pop(url, None)
        if seq is None:  # no place in the send order: counted as answered
            if not repeat:
                self.consecutive = self.consecutive + 1 if failed else 0
        else:
            self.in_flight.discard(seq)
            self.outcomes[seq] = _REPEAT if repeat else _FAILED if failed else _OK
            if len(self.outcomes) > _OUTCOMES_KEPT:
                del self.outcomes[next(iter(self.outcomes))]
            self.consecutive = self._run(seq) if failed and not repeat else 0
        if repeat:
            return False
        self.recent.append(failed)
        return True

    def _run(self, seq: int) -> int:
        """Failures in a row in send order through ``seq``: a success or a request still in
        flight ends the run; repeats and requests never sent are passed over."""
        return 1 + self._side(seq, -1) + self._side(seq, +1)

    def _side(self, seq: int, step: int) -> int:
        count = 0
        lowest = self.next_seq - _OUTCOMES_KEPT
        cursor = seq + step
        while lowest <= cursor < self.next_seq and cursor >= 0:
            if cursor in self.in_flight:
                break
            outcome = self.outcomes.get(cursor)
            if outcome == _OK:
                break
            if outcome == _FAILED:
                count += 1
            cursor += step
        return count

    def _should_open(self) -> bool:
        s = self.board.settings
        if self.consecutive >= s.failures:
            return True
        recent = self.recent
        return len(recent) >= s.window and sum(recent) >= s.failure_ratio * len(recent)

    async def _trip(self, seen_epoch: int) -> None:
        board = self.board
        async with board.lock:  # one trip per epoch from this worker, even when many fail
            if self.snapshot.epoch != seen_epoch and not self.snapshot.closed:
                return
            failures = self.consecutive
            now = board.clock()
            tripped, opened = await board.store.trip(self.host, seen_epoch, now, board.rng.random())
            self.snapshot = tripped
            self.read_at = time.monotonic()
            self.reset_counts()
            if opened:
                board.opened += 1
                board.tell(
                    "opened",
                    host=self.host,
                    epoch=tripped.epoch,
                    opens=tripped.opens,
                    until=tripped.until,
                    cooldown_s=round(tripped.until - now, 3),
                    consecutive_failures=failures,
                )

    def reset_counts(self) -> None:
        self.consecutive = 0
        self.recent.clear()
        self.failing.clear()
        self.outcomes.clear()


class CircuitBoard:
    """Every host's breaker for one engine (:class:`HostCircuit`, one per host, made on first
    use), its store, settings and listeners; the host-keyed methods ask the host's breaker.

    ``probe_window_s`` (the request deadline) is how long a half-open probe slot is held: a
    probe lost to a cancelled batch frees its slot at the next round, so a breaker never
    stays half-open for good.
    """

    def __init__(
        self,
        settings: CircuitSettings,
        *,
        store: CircuitStore | None = None,
        probe_window_s: float = defaults.REQUEST_DEADLINE_S,
        sync_s: float = defaults.CIRCUIT_SYNC_S,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store: CircuitStore = store or MemoryCircuitStore(settings)
        self.shared = not isinstance(self.store, MemoryCircuitStore)
        self.probe_window_s = probe_window_s
        self.sync_s = sync_s if self.shared else 0.0
        self.rng = rng or random.Random()
        self.clock = clock
        self.listeners: list[CircuitListener] = []
        self.opened = 0  # openings this board made (its trips; others' are not counted)
        self.closed = 0
        self._hosts: dict[str, HostCircuit] = {}
        self.lock = asyncio.Lock()

    def host(self, host: str) -> HostCircuit:
        """``host``'s breaker (made closed on first use); the engine keeps it in its slot."""
        breaker = self._hosts.get(host)
        if breaker is None:
            breaker = self._hosts[host] = HostCircuit(self, host)
        return breaker

    def deferred_until(self, host: str) -> float | None:
        """Without I/O: when the host's breaker is known open, until when; else None."""
        breaker = self._hosts.get(host)
        return None if breaker is None else breaker.deferred_until()

    async def admit(self, host: str) -> Admission:
        """May one request go to ``host`` now? Closed: yes; open: defer; half-open: a probe."""
        return await self.host(host).admit()

    async def record(
        self, host: str, admission: Admission, *, failed: bool, url: str | None = None
    ) -> None:
        """The outcome of a request ``admit`` let through (see :meth:`HostCircuit.record`)."""
        await self.host(host).record(admission, failed=failed, url=url)

    def forget(self, host: str, admission: Admission) -> None:
        """``admission`` let a request through that was not sent or will not answer (too late
        for its batch, cancelled): it no longer holds back a run of failures around it."""
        if (breaker := self._hosts.get(host)) is not None:
            breaker.forget(admission)

    def tell(self, kind: str, **data: Any) -> None:
        for listener in self.listeners:
            listener(kind, data)

    def open_hosts(self) -> dict[str, float]:
        """Hosts known open or half-open (host -> until), from the last snapshots read."""
        return {host: b.snapshot.until for host, b in self._hosts.items() if not b.snapshot.closed}

    async def aclose(self) -> None:
        await self.store.aclose()
