"""What is done with a run found dead: its flow run marked Crashed, its items and lock freed;
and what a Crashed message says when the worker saw its flow process end on a signal.

Used by the source lock when it finds its holder dead (``flows/_locks.py``) and by the
``dead-run-sweeper`` flow (``flows/sweep.py``), which looks at every running collect and triage
run on a short schedule. Both judge from Collector's own heartbeats (the lock's beat Variable and
the frontier's holders), so a dead run is found even when Prefect's zombie automation lost its
state (a Redis restart) or the services process is down; that automation stays as a second line.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import time
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.states import Crashed

from collector.backends import open_frontier
from collector.config import Source

__all__ = [
    "crash_message",
    "crash_task_runs",
    "declare_dead_in_frontier",
    "exit_message",
    "mark_crashed",
    "revoke_in_frontier",
    "say_how_it_crashed",
]

log = logging.getLogger(__name__)


def crash_message(why: str, *, found_by: str) -> str:
    """The Crashed state's message: what was seen, by whom, and what was done."""
    return (
        f"no heartbeat from this run: {why}; marked Crashed by {found_by}, its leased items "
        "went back to the queue and its source lock was freed"
    )


async def mark_crashed(client: PrefectClient, run_id: str, message: str) -> bool:
    """Set flow run ``run_id`` Crashed with ``message`` unless it already ended; True if set.

    Forced (a RUNNING run that cannot report any more would otherwise be refused by no rule,
    but a PENDING or a paused one would); a run that already ended keeps its final state. Its
    task runs that had not ended (the ``fetch-batch`` in flight when it died) are marked
    Crashed too, either way: nobody is left to end them, and they stayed RUNNING for good.
    """
    try:
        flow_run = await client.read_flow_run(UUID(run_id))
    except (ValueError, LookupError):  # not a flow run id (a CLI helper's own holder id)
        return False
    except Exception as exc:  # ObjectNotFound and HTTP errors: nothing to mark
        log.debug("flow run %s not read: %s", run_id, exc)
        return False
    await crash_task_runs(client, flow_run.id, message)
    if flow_run.state is not None and flow_run.state.is_final():
        return False
    await client.set_flow_run_state(flow_run.id, Crashed(message=message), force=True)
    return True


async def crash_task_runs(client: PrefectClient, flow_run_id: UUID, message: str) -> int:
    """Mark Crashed every task run of a dead flow run that has not ended; returns how many."""
    unended = TaskRunFilter(
        state=TaskRunFilterState(
            type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
        )
    )
    task_runs = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
        task_run_filter=unended,
    )
    for task_run in task_runs:
        await client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
    return len(task_runs)


def declare_dead_in_frontier(source: Source, holder: str) -> None:
    """Set ``holder``'s frontier heartbeat back to the epoch: the next look at the source's
    holders (the run taking over, as it drains) revokes its leases at once and counts them."""
    with open_frontier(source) as frontier:
        if any(h.holder == holder for h in frontier.holders(source.name)):
            frontier.beat(source.name, holder, now=0.0)


def revoke_in_frontier(source: Source, holder: str) -> int:
    """Return ``holder``'s leased items to the queue now (no run is about to look)."""
    with open_frontier(source) as frontier:
        return int(frontier.revoke(source.name, holder, now=time.time()))


_EXIT = re.compile(r"(?:status code:?|exited with non-zero status code) (-?\d+)")


def exit_message(message: str, *, worker: str) -> str | None:
    """What is known about a flow process that ended on a signal, from the worker's Crashed
    message (``Process exited with status code: -9. <Prefect's guess>``); None otherwise.

    Prefect adds a guess to -9 (a memory limit, or a manual cancellation); the worker knows
    only that the process got the signal while the worker itself lived on, so that is said.
    """
    found = _EXIT.search(message)
    if found is None or int(found.group(1)) >= 0:
        return None
    number = -int(found.group(1))
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    cancel = (
        "; a Prefect cancellation sends SIGTERM first, so this was not one asked for in Prefect"
        if number == signal.SIGKILL
        else ""
    )
    return (
        f"the flow process was ended by signal {number} ({name}) while its worker {worker} "
        f"stayed alive and reported it; who sent the signal is not known to the worker{cancel}"
    )


async def say_how_it_crashed(flow: object, flow_run: FlowRun, state: State[Any]) -> None:
    """``on_crashed`` hook: replace Prefect's guess about a signal with what is known (see
    :func:`exit_message`). The process worker runs it (in Prefect 3.9, in a subprocess of its
    own) a few seconds after it reported the run Crashed, so the message is replaced then."""
    told = exit_message(state.message or "", worker=f"on {socket.gethostname()}")
    if told is None:
        return
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Crashed(message=told), force=True)
