"""Cross-worker locks on Prefect global concurrency limits (names from ``collector.locks``).

``source_lock``: ``source:<name>`` (limit 1, created when missing) held for a whole ``run``, with a
lease Prefect renews every 3/4 of ``locks.lease_s`` from a thread. A run that dies keeps the lock
until its lease expires and the Prefect server's repossessor service revokes it (a server started
with ``prefect server start``; the temporary in-process servers run no services, see README).

``domain_slots``: the ``domain:<host>`` slots of one batch, taken in host order (so two workers
never hold part of each other's hosts while waiting), released when the batch's fetch ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Literal
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.asyncio import (
    AcquireConcurrencySlotTimeoutError,
    ConcurrencySlotAcquisitionError,
    concurrency,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from collector import defaults
from collector.config import Source
from collector.locks import SourceBusy, domain_lock_name, source_lock_name

__all__ = ["domain_slots", "ensure_limit", "source_lock"]

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
) -> AsyncIterator[bool]:
    """Hold ``source:<name>`` for the block; yields False when busy and ``on_busy`` is skip.

    Raises SourceBusy when ``on_busy`` is wait and the lock stayed taken for ``wait_s``.
    """
    if not source.locks.source_lock:
        yield True
        return
    name = source_lock_name(source.name)
    await ensure_limit(name, 1)
    waits = on_busy == "wait" and wait_s > 0
    async with contextlib.AsyncExitStack() as stack:
        busy: BaseException | None = None
        try:
            await stack.enter_async_context(
                concurrency(
                    name,
                    occupy=1,
                    timeout_seconds=wait_s if waits else None,
                    max_retries=None if waits else 0,
                    lease_duration=source.locks.lease_s,
                    strict=True,
                    holder=_holder(holder),
                )
            )
        except (AcquireConcurrencySlotTimeoutError, ConcurrencySlotAcquisitionError) as exc:
            if isinstance(exc, ConcurrencySlotAcquisitionError) and not _locked(exc):
                raise
            busy = exc
        if busy is not None and on_busy == "wait":
            raise SourceBusy(
                f"another run of {source.name!r} holds the Prefect concurrency limit {name!r} "
                f"(waited {wait_s:g}s); if that run died, its lease ends after "
                f"{source.locks.lease_s:g}s on a server that runs the repossessor service"
            ) from busy
        yield busy is None


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
