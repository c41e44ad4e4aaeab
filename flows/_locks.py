"""Cross-worker locks on Prefect global concurrency limits (names from ``collector.run.locks``).

``source_lock``: ``source:<name>`` (limit 1, created when missing) held for a whole ``run``, with a
lease Prefect renews every 3/4 of ``locks.lease_s`` from a thread, and a heartbeat Variable that
lets a waiter recognise a holder that died and take its slot back (see ``_heartbeat``): the same
rhythm as the frontier's holders (a beat every ``HEARTBEAT_S``, dead after ``HOLDER_DEAD_AFTER_S``
of silence), so a rerun after a SIGKILL takes the source back as soon as it revokes the leases.

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
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Literal, TypeVar
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.asyncio import (
    ConcurrencySlotAcquisitionError,
    concurrency,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.logging import get_logger

from collector import defaults
from collector.config import Source
from collector.errors import ConfigError
from collector.run.locks import SourceBusy, domain_lock_name, source_lock_name
from collector.run.stop import StoppedWaiting, process_stop
from flows._variables import variable_name

__all__ = [
    "call_under_source_lock",
    "domain_slots",
    "ensure_limit",
    "quiet_console_for_the_command",
    "source_lock",
]

T = TypeVar("T")

_limits_seen: dict[str, int] = {}  # limit name -> its size, read once per process


async def ensure_limit(name: str, limit: int) -> int:
    """Create the global concurrency limit ``name`` with ``limit`` slots if missing; its size."""
    if name in _limits_seen:
        return _limits_seen[name]
    async with get_client() as client:
        try:
            found = await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another worker was first
                await client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit)
                )
            found = await client.read_global_concurrency_limit_by_name(name)
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
    ``on_wait`` hears, once, that the lock is taken and this run starts waiting (a line for
    the terminal: otherwise a rerun after a crash looks stuck for up to 30 s).
    """
    if not source.locks.source_lock:
        yield True
        return
    name = source_lock_name(source.name)
    await ensure_limit(name, 1)
    waits = on_busy == "wait" and wait_s > 0
    deadline = time.monotonic() + wait_s
    # Poll with single non-blocking tries rather than one blocking wait: a holder that died
    # while we wait is noticed between tries, and a try that fails leaves nothing behind (a
    # blocking try that times out keeps retrying inside Prefect's slot service and would take
    # the slot later for a run that stopped waiting).
    lock_holder = _holder(holder)
    if lock_holder is not None:
        _expected_failures.holders.add(lock_holder.id)
    async with contextlib.AsyncExitStack() as stack:
        busy: BaseException | None = None
        while True:
            await _reclaim_if_holder_died(source, name)
            try:
                await stack.enter_async_context(
                    concurrency(
                        name,
                        occupy=1,
                        max_retries=0,
                        lease_duration=source.locks.lease_s,
                        strict=True,
                        holder=lock_holder,
                    )
                )
                busy = None
                break
            except ConcurrencySlotAcquisitionError as exc:
                if not _locked(exc):
                    raise
                busy = exc
                remaining = deadline - time.monotonic()
                if not waits or remaining <= 0:
                    break
                if on_wait is not None:
                    on_wait(
                        f"{name} is held by another run: waiting up to {wait_s:g}s (a holder "
                        f"silent for {defaults.HOLDER_DEAD_AFTER_S:g}s is taken over)"
                    )
                    on_wait = None
                if process_stop.reason is not None:  # Ctrl-C while waiting: nothing was held
                    raise StoppedWaiting(process_stop.reason, f"the source lock {name!r}") from None
                await asyncio.sleep(min(remaining, defaults.LOCK_POLL_S))
        if busy is not None and on_busy == "wait":
            raise SourceBusy(
                f"another run of {source.name!r} holds the Prefect concurrency limit {name!r} "
                f"(waited {wait_s:g}s); a run that died is detected "
                f"{defaults.HOLDER_DEAD_AFTER_S:g}s after its last heartbeat, its slot taken back"
            ) from busy
        if busy is None:
            beat = asyncio.create_task(_heartbeat(source, holder))
            stack.push_async_callback(_stop_heartbeat, beat, source, holder)
        yield busy is None


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


class _ExpectedLockFailures(logging.Filter):
    """Drop Prefect's ERROR record for a source-lock try that found the lock taken.

    We poll for the lock (to notice a dead holder between tries), and Prefect's slot service
    logs every refused try at ERROR with a repr of its arguments. A busy lock is expected and
    reported by us in one line (SourceBusy), so those records, recognised by our holder id and
    a failed future, go.
    """

    def __init__(self) -> None:
        super().__init__()
        self.holders: set[UUID] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if not isinstance(arg, tuple):
                continue
            holder = next((a for a in arg if isinstance(a, ConcurrencyLeaseHolder)), None)
            future = next((a for a in arg if isinstance(a, concurrent.futures.Future)), None)
            if (
                holder is not None
                and holder.id in self.holders
                and future is not None
                and future.done()
                and future.exception() is not None
            ):
                return False
        return True


_expected_failures = _ExpectedLockFailures()
logging.getLogger("prefect._internal.concurrency").addFilter(_expected_failures)


class _SaidByTheCommandFilter(logging.Filter):
    """Drop, from the console only, the flow engine's records of a flow that ended SourceBusy
    or ConfigError (a suite GX rejects, found as the run starts).

    Prefect logs a failed flow's exception with its traceback and then its final state; for
    these the command already says what happened in one line. The API handler is left alone,
    so the flow run's logs in the UI keep the full record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SourceBusy | ConfigError):
            return False
        if not record.name.startswith("prefect.flow_runs"):
            return True
        text = record.getMessage()
        return not any(said in text for said in _SAID_BY_THE_COMMAND)


# What the flow logs (for the UI) that `collector run` then says itself in one line: an
# interrupted run's summary (the flow's warning, and the engine's "Finished in state
# Cancelled(...)" with the same text), a skipped run, and the two errors above.
_SAID_BY_THE_COMMAND = (
    "SourceBusy",
    "ConfigError",
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


def _heartbeat_variable(source: Source) -> str:
    return variable_name("collector-lock", source.name)


async def _heartbeat(source: Source, holder: str) -> None:
    """Tell waiters this holder is alive: a Prefect Variable rewritten every ``HEARTBEAT_S``.

    Prefect ends a dead holder's lease only through the server's repossessor service, which
    temporary local servers do not run, and offers no API to list a limit's holders; so the
    holder's liveness is published here, where any waiter can read it.
    """
    from prefect.variables import Variable

    name = _heartbeat_variable(source)
    while True:
        with contextlib.suppress(Exception):  # a missed beat only shortens what others wait
            await Variable.aset(name, {"holder": holder, "at": time.time()}, overwrite=True)
        await asyncio.sleep(defaults.HEARTBEAT_S)


async def _stop_heartbeat(beat: asyncio.Task[None], source: Source, holder: str) -> None:
    from prefect.variables import Variable

    beat.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beat
    name = _heartbeat_variable(source)
    with contextlib.suppress(Exception):
        current = await Variable.aget(name)
        if isinstance(current, dict) and current.get("holder") == holder:
            await Variable.aunset(name)


async def _reclaim_if_holder_died(source: Source, name: str) -> bool:
    """Free ``source:<name>`` when its holder's heartbeat is ``HOLDER_DEAD_AFTER_S`` old.

    That is the repossessor's rule (an unrenewed lease is over) applied by the waiter, so a run
    killed with SIGKILL does not block its source forever on a server without that service; and
    sooner than the lease (Prefect's minimum is 60 s), on the frontier's rule for a dead holder.
    Two waiters may both free it; the limit still lets only one of them in, and the fencing
    tokens protect the data even if a holder that was merely paused comes back.
    """
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.variables import Variable

    variable = _heartbeat_variable(source)
    beat = await Variable.aget(variable)
    if not isinstance(beat, dict):
        return False  # no Collector holder on record (or it ended cleanly): nothing to judge
    age_s = time.time() - float(beat.get("at", 0.0))
    if age_s <= defaults.HOLDER_DEAD_AFTER_S:
        return False
    async with get_client() as client:
        await client.update_global_concurrency_limit(
            name, GlobalConcurrencyLimitUpdate(active_slots=0)
        )
    with contextlib.suppress(Exception):
        await Variable.aunset(variable)
    get_logger(__name__).warning(
        "%s: holder %s gave no sign of life for %.0fs (dead after %gs): its slot was taken back",
        name, beat.get("holder"), age_s, defaults.HOLDER_DEAD_AFTER_S,
    )  # fmt: skip
    return True


def _locked(exc: BaseException) -> bool:
    """True when the acquisition failed because the limit was full (HTTP 423)."""
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    return getattr(response, "status_code", None) == 423


def _holder(run_id: str) -> ConcurrencyLeaseHolder | None:
    try:
        return ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id))
    except ValueError:
        return None


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
