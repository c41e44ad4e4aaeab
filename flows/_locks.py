"""Cross-worker locks on Prefect global concurrency limits (names from ``collector.run.locks``),
through Prefect's public client only (read a limit, increment with a lease, renew, release).

``source_lock``: ``source:<name>`` (limit 1, created when missing) held for a whole ``run``, with a
lease renewed every ``locks.lease_s / 4`` from a thread, and a beat Variable
(``collector-lock-<name>``, a :class:`~collector.run.liveness.LockBeat`: run id, time, machine,
pid, lease id) rewritten every ``HEARTBEAT_S`` from the same thread. A waiter that finds the lock
taken judges that beat (:func:`~collector.run.liveness.judge_beat`): a holder whose process is
gone from this machine is dead at once (a rerun after a SIGKILL starts without waiting), one
silent for ``HOLDER_DEAD_AFTER_S`` is dead wherever it ran. A dead holder's lease is released by
id, its flow run marked Crashed, its frontier leases revoked by the run taking over
(``flows/_dead_runs.py``).

``call_under_source_lock``: the same lock around an operator's change made outside a run (triage,
``collector deadletters retry``, a review's accept): they turn dead pages back into queued or done
ones, and a full plan counts a source's dead pages in its run's account, so changing them under a
run in progress would make that run's ledger fail. They wait for the lock like a run (up to
``locks.wait_s``), then give up with SourceBusy having changed nothing.

``domain_slots``: the ``domain:<host>`` slots of one batch, taken in host order (so two workers
never hold part of each other's hosts while waiting), released when the batch's fetch ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal, TypeGuard, TypeVar
from uuid import UUID

import httpx
from cachetools import LRUCache
from prefect.client.orchestration import PrefectClient, SyncPrefectClient, get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    VariableCreate,
    VariableUpdate,
)
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.asyncio import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.logging import get_logger

from collector import defaults
from collector._text import one_line
from collector.config import Source
from collector.errors import ConfigError
from collector.run.liveness import LockBeat, judge_beat, machine, this_process
from collector.run.locks import SourceBusy, domain_lock_name, source_lock_name
from collector.run.stop import LostFooting, StoppedWaiting, process_footing, process_stop
from flows._dead_runs import crash_message, declare_dead_in_frontier, mark_crashed
from flows._variables import variable_name

__all__ = [
    "call_under_source_lock",
    "domain_slots",
    "ensure_limit",
    "quiet_console_for_the_command",
    "source_lock",
]

T = TypeVar("T")

# Process-wide: a limit lives on the server, beyond any run, so its size is read once per process
# (limit name -> size); one a source and one a host, so bounded: the least recently used name
# is forgotten past LIMITS_KEPT, and read again when next needed.
LIMITS_KEPT = 1_024
_limits_seen: LRUCache[str, int] = LRUCache(maxsize=LIMITS_KEPT)
_limits_lock = threading.Lock()  # the flows of one process may run on loops in several threads


async def ensure_limit(name: str, limit: int) -> int:
    """Create the global concurrency limit ``name`` with ``limit`` slots if missing; its size."""
    with _limits_lock:
        known = _limits_seen.get(name)
    if known is not None:
        return known
    async with get_client() as client:
        try:
            found = await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another worker was first
                await client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit)
                )
            found = await client.read_global_concurrency_limit_by_name(name)
    with _limits_lock:
        _limits_seen[name] = found.limit
    return found.limit


@contextlib.asynccontextmanager
async def source_lock(
    source: Source,
    *,
    holder: str,
    on_busy: Literal["wait", "skip"],
    wait_s: float,
    on_wait: Callable[[str], None] | None = None,
) -> AsyncIterator[bool]:
    """Hold ``source:<name>`` for the block; yields False when busy and ``on_busy`` is skip.

    Raises SourceBusy when ``on_busy`` is wait and the lock stayed taken for ``wait_s``.
    ``on_wait`` hears, once, that the lock is taken, by whom and how long this run will wait
    (a line for the terminal: otherwise a wait looks like a hang).
    """
    if not source.locks.source_lock:
        yield True
        return
    name = source_lock_name(source.name)
    await ensure_limit(name, 1)
    waits = on_busy == "wait" and wait_s > 0
    deadline = time.monotonic() + wait_s
    # Single tries in a loop rather than one blocking wait: a holder that dies while we wait
    # is noticed between tries, and a refused try leaves nothing behind.
    while (lease_id := await _take(source, name, holder)) is None:
        remaining = deadline - time.monotonic()
        if not waits or remaining <= 0:
            if on_busy == "wait":
                raise SourceBusy(
                    f"another run of {source.name!r} holds the Prefect concurrency limit "
                    f"{name!r} (waited {wait_s:g}s); a run that died is taken over at once "
                    f"on its own machine, elsewhere {defaults.HOLDER_DEAD_AFTER_S:g}s after "
                    "its last heartbeat"
                )
            yield False
            return
        if on_wait is not None:
            on_wait(
                f"{name} is held by another run: waiting up to {wait_s:g}s ({await _who(source)})"
            )
            on_wait = None
        if process_stop.reason is not None:  # Ctrl-C while waiting: nothing was held
            raise StoppedWaiting(process_stop.reason, f"the source lock {name!r}")
        await asyncio.sleep(min(remaining, defaults.LOCK_POLL_S))
    process_footing.reset()  # a loss of an earlier run in this process is not this one's
    beater = await asyncio.to_thread(_LockBeater, source, holder, lease_id)  # its first beat
    try:
        yield True
    finally:
        await asyncio.to_thread(beater.stop)
        process_footing.reset()


def call_under_source_lock(source: Source, work: Callable[[], T]) -> T:
    """``work()`` (blocking, run in a thread) while this process holds ``source:<name>``.

    For commands outside a flow; waits up to ``locks.wait_s`` and raises SourceBusy after that,
    before ``work`` starts. A source without the lock (``locks.source_lock: false``) runs
    ``work`` at once: its runs do not take it either.
    """
    if not source.locks.source_lock:
        return work()

    async def locked() -> T:
        holder = str(uuid.uuid4())  # a lease holder id of its own (our busy tries stay quiet)
        async with source_lock(source, holder=holder, on_busy="wait", wait_s=source.locks.wait_s):
            return await asyncio.to_thread(work)

    return asyncio.run(locked())


class _SaidByTheCommandFilter(logging.Filter):
    """Drop, from the console only, the flow engine's records of a flow that ended SourceBusy,
    ConfigError (a suite GX rejects, found as the run starts) or LostFooting.

    Prefect logs a failed flow's exception with its traceback and then its final state; for
    these the command already says what happened in one line. The API handler is left alone,
    so the flow run's logs in the UI keep the full record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SourceBusy | ConfigError | LostFooting):
            return False
        if not record.name.startswith("prefect.flow_runs"):
            return True
        text = record.getMessage()
        return not any(said in text for said in _SAID_BY_THE_COMMAND)


# What the flow logs (for the UI) that `collector run` then says itself in one line: an
# interrupted run's summary (the flow's warning, and the engine's "Finished in state
# Cancelled(...)" with the same text), a skipped run, and the three errors above.
_SAID_BY_THE_COMMAND = (
    "SourceBusy",
    "ConfigError",
    "LostFooting",
    "interrupted by ",
    "skipped: another run of",
)


def quiet_console_for_the_command() -> None:
    """Install :class:`_SaidByTheCommandFilter` on Prefect's console handlers (CLI process)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, _SaidByTheCommandFilter) for f in handler.filters
        ):
            handler.addFilter(_SaidByTheCommandFilter())


def _beat_variable(source: Source) -> str:
    return variable_name("collector-lock", source.name)


def _holder(run_id: str) -> ConcurrencyLeaseHolder | None:
    try:
        return ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id))
    except ValueError:
        return None


async def _take(source: Source, name: str, holder: str) -> UUID | None:
    """One try at ``name`` through the public client: the lease id, or None when busy.

    A full limit is read as busy (after taking a dead holder's slot back, see
    :func:`_take_back_if_dead`); a refused increment is busy only if the limit is full when
    read again (someone came between), any other refusal is raised.
    """
    async with get_client() as client:
        limit = await client.read_global_concurrency_limit_by_name(name)
        if limit.active_slots >= limit.limit and not await _take_back_if_dead(client, source, name):
            return None
        try:
            response = await client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency",
                lease_duration=source.locks.lease_s, holder=_holder(holder),
            )  # fmt: skip
        except httpx.HTTPStatusError:
            limit = await client.read_global_concurrency_limit_by_name(name)
            if limit.active_slots >= limit.limit:
                return None
            raise
    return UUID(str(response.json()["lease_id"]))


async def _who(source: Source) -> str:
    """Who holds the lock and what ends the wait (said once when a wait begins)."""
    from prefect.variables import Variable

    beat = LockBeat.from_json(await Variable.aget(_beat_variable(source)))
    if beat is None:
        return "no Collector heartbeat on record: until its holder lets go or its lease ends"
    verdict = judge_beat(beat, now=time.time(), here=machine())
    return (
        f"run {beat.holder}: {verdict.why}; taken over if it stays silent "
        f"{max(verdict.wait_s, 0.0):.0f}s more"
    )


async def _take_back_if_dead(client: PrefectClient, source: Source, name: str) -> bool:
    """Free ``name`` when the holder on record is dead (:func:`judge_beat`); True if freed.

    The slot is freed by :func:`release_dead_holder`. Its flow run, if still running, is
    marked Crashed with the reason, and its frontier heartbeat is set back to the epoch so the
    run taking over revokes its leases at once. Two waiters may both free it; the limit still
    lets only one in, and the fencing tokens protect the data even if a holder that was merely
    paused comes back.
    """
    raw, beat = await read_beat(source)
    if beat is None:
        return False  # no Collector holder on record (or it ended cleanly): nothing to judge
    verdict = judge_beat(beat, now=time.time(), here=machine())
    if not verdict.dead:
        return False
    await release_dead_holder(client, source, raw)
    get_logger(__name__).warning(
        "%s taken over from run %s, which is dead: %s", name, beat.holder, verdict.why
    )
    try:
        await asyncio.to_thread(declare_dead_in_frontier, source, beat.holder)
        await mark_crashed(
            client, beat.holder, crash_message(verdict.why, found_by=f"a run taking {name}")
        )
    except Exception as exc:  # the lock is free; the drain still judges the frontier itself
        get_logger(__name__).warning("%s: the dead holder's run was not marked: %s", name, exc)
    return True


async def release_dead_holder(client: PrefectClient, source: Source, raw: object) -> None:
    """Free ``source:<name>`` from the dead holder whose beat Variable reads ``raw``.

    Its lease is released by id while the server still has it (a slot freed that way can only
    be that lease's). If the lease is lost (e.g. with a Redis that kept Prefect's lease storage)
    or there never was one, one slot is given back, only while the limit is full and that dead
    beat is still the one on record. The beat is then removed.
    """
    from prefect.variables import Variable

    name = source_lock_name(source.name)
    variable = _beat_variable(source)
    beat = LockBeat.from_json(raw)
    if beat is None:
        return
    if await _lease_on_record(client, beat.lease_id):
        await client.release_concurrency_slots_with_lease(UUID(beat.lease_id))
    else:  # lost or never had one: give one slot back, unless a new holder is on record
        limit = await client.read_global_concurrency_limit_by_name(name)
        if limit.active_slots >= limit.limit and await Variable.aget(variable) == raw:
            await client.release_concurrency_slots(
                names=[name], slots=1, occupancy_seconds=max(0.0, time.time() - beat.at)
            )
    if await Variable.aget(variable) == raw:
        await Variable.aunset(variable)


async def _lease_on_record(client: PrefectClient, lease_id: str) -> bool:
    """Does the server still hold lease ``lease_id``? Asked by renewing it briefly (the public
    API has no read of a lease; a renewal of a lost lease is refused)."""
    try:
        await client.renew_concurrency_lease(UUID(lease_id), lease_duration=60)
    except (ValueError, httpx.HTTPStatusError):
        return False
    return True


async def read_beat(source: Source) -> tuple[object, LockBeat | None]:
    """The lock's beat Variable as stored, and as a :class:`LockBeat` (None: no holder)."""
    from prefect.variables import Variable

    raw = await Variable.aget(_beat_variable(source))
    return raw, LockBeat.from_json(raw)


@contextlib.contextmanager
def _prompt_client() -> Iterator[SyncPrefectClient]:
    """A client whose calls fail within two beats (10 s at least), unretried: the beater counts
    its margins in beats, and Prefect's own retries (5, backing off 2 to 32 s, each waiting up to
    its 60 s timeout) would hide an outage well past them."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    timeout = max(2 * defaults.HEARTBEAT_S, 10.0)
    with (
        temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}),  # this thread's context
        get_client({"timeout": timeout}, sync_client=True) as client,
    ):
        yield client


class _LockBeater:
    """The holder's beat (a Variable every ``HEARTBEAT_S``) and its lease's renewal, on a
    thread of its own, so a loop busy with a long settle does not look dead; released on stop.

    Prefect ends an unrenewed lease only through the server's repossessor service (temporary
    local servers do not run it) and lists no holders, so the holder's liveness is published
    here for any waiter (:func:`_take_back_if_dead`) and the dead-run sweeper to judge.
    """

    def __init__(self, source: Source, holder: str, lease_id: UUID) -> None:
        here, pid, started = this_process()
        self.variable = _beat_variable(source)
        self.name = source_lock_name(source.name)
        self.lease_id = lease_id
        self.lease_s = source.locks.lease_s
        self.beat = LockBeat(holder, 0.0, here, pid, started, str(lease_id))
        self._stopped = threading.Event()
        self._beat_once()  # on record before the run starts: a waiter can judge it at once
        # In this context: Prefect's settings (which API) and the run's context are context
        # variables a bare thread does not inherit. Without it, a process that chose its API by
        # context (``prefect_test_harness``, ``temporary_settings``) beat on a server of its own
        # (Prefect started an ephemeral one): the lease on the real one went unrenewed.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run,), name=f"lock-beat-{holder[:12]}", daemon=True
        )
        self._thread.start()

    def _beat_once(self, client: SyncPrefectClient | None = None) -> bool:
        """Publish one beat; False when it did not go through (retried next beat). ``client``:
        the beat thread's own (one per thread: a client costs a settings copy and an SSL
        context, ~0.1 s of CPU, which a beat every few seconds would pay each time)."""
        beat = dataclasses.replace(self.beat, at=time.time())
        try:
            with contextlib.nullcontext(client) if client else _prompt_client() as api:
                if api.read_variable_by_name(self.variable) is None:
                    api.create_variable(VariableCreate(name=self.variable, value=beat.as_json()))
                else:
                    api.update_variable(VariableUpdate(name=self.variable, value=beat.as_json()))
        except Exception as exc:
            get_logger(__name__).warning("the source lock's beat was missed: %s", exc)
            return False
        return True

    def _run(self) -> None:
        """Beat and renew until stopped, or until the lock is lost: the lease is gone from the
        server (404/410: a waiter judged this run dead and took the lock), it went unrenewed
        for all but one beat of its lease, or no beat went through for all but one beat of
        ``HOLDER_DEAD_AFTER_S`` (a waiter may take the lock any moment). A loss is said once,
        to the run (``process_footing``), and ends the beat: this run no longer holds it."""
        try:
            with _prompt_client() as client:  # this thread's, for its whole life
                self._beat_and_renew(client)
        except Exception as exc:  # a beat that died silently would let a waiter take the lock
            self._lose(f"its beat thread raised {type(exc).__name__}: {one_line(exc)}")

    def _beat_and_renew(self, client: SyncPrefectClient) -> None:
        renewed = beaten = time.monotonic()  # monotonic: a wall-clock jump changes neither
        while not self._stopped.wait(defaults.HEARTBEAT_S):
            if self._beat_once(client):
                beaten = time.monotonic()
            elif time.monotonic() - beaten >= defaults.HOLDER_DEAD_AFTER_S - defaults.HEARTBEAT_S:
                self._lose(f"no beat went through for {time.monotonic() - beaten:.0f}s")
                return
            if time.monotonic() - renewed < self.lease_s / 4:
                continue
            try:
                client.renew_concurrency_lease(self.lease_id, self.lease_s)
                renewed = time.monotonic()
            except Exception as exc:
                silent = time.monotonic() - renewed
                if _gone(exc):
                    self._lose(f"the server no longer has its lease ({_answer(exc)})")
                    return
                if silent >= self.lease_s - defaults.HEARTBEAT_S:
                    self._lose(f"its lease was not renewed for {silent:.0f}s ({one_line(exc)})")
                    return
                get_logger(__name__).warning(
                    "the source lock's lease was not renewed (retrying): %s", exc
                )

    def _lose(self, why: str) -> None:
        if self._stopped.is_set():  # the run is releasing the lock anyway
            return
        what = f"its source lock {self.name!r}: {why}"
        get_logger(__name__).error("lost %s", what)
        process_footing.request(what)

    def stop(self) -> None:
        """End the beat, release the lease, remove the beat if it is still ours (sync)."""
        self._stopped.set()
        self._thread.join(timeout=defaults.HEARTBEAT_S + 30)
        with contextlib.suppress(Exception), get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(self.lease_id)
            current = client.read_variable_by_name(self.variable)
            beat = LockBeat.from_json(current.value if current is not None else None)
            if beat is not None and beat.holder == self.beat.holder:
                client.delete_variable_by_name(self.variable)


@contextlib.asynccontextmanager
async def domain_slots(
    source: Source, wanted: dict[str, int], *, holder: str
) -> AsyncIterator[dict[str, int]]:
    """Take ``domain:<host>`` slots for one batch; yields the slots granted per host.

    Each host gets ``min(wanted, the limit's size)`` (a limit smaller than the batch's share
    would otherwise never grant it); limits are created with ``per_domain_concurrency`` slots.
    """
    granted: dict[str, int] = {}
    lease_s = max(60.0, source.ttl.batch_timeout_s)
    async with contextlib.AsyncExitStack() as stack:
        for host in sorted(wanted):
            name = domain_lock_name(host)
            size = await ensure_limit(name, source.limits.per_domain_concurrency)
            slots = max(1, min(wanted[host], size))
            await stack.enter_async_context(
                concurrency(
                    name,
                    occupy=slots,
                    timeout_seconds=defaults.DOMAIN_LOCK_WAIT_S,
                    lease_duration=lease_s,
                    strict=True,
                    holder=_holder(holder),
                )
            )
            granted[host] = slots
        yield granted


def _gone(exc: BaseException) -> TypeGuard[httpx.HTTPStatusError]:
    """The server says the lease does not exist (any more): 404 or 410."""
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in {404, 410}


def _answer(exc: httpx.HTTPStatusError) -> str:
    """The server's answer in a few words: ``410 Gone: Lease not found.`` (httpx's own text
    adds the URL and a link to MDN, which the operator's one line has no room for)."""
    response = exc.response
    detail = ""
    with contextlib.suppress(Exception):
        body = response.json()
        detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
    said = f"{response.status_code} {response.reason_phrase}".strip()
    return one_line(f"{said}: {detail}" if detail else said)
