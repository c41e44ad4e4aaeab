"""The dead-run sweeper on a real Prefect API: a run whose heartbeats stopped is Crashed, its
leases and source lock freed, and the next run completes the source exactly; a live run and a
run with no heartbeat on record are left alone."""

from __future__ import annotations

import time
from pathlib import Path
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from collector.backends import open_frontier
from collector.config import load_source
from collector.defaults import HOLDER_DEAD_AFTER_S
from collector.run.liveness import LockBeat
from flows.collect import collect
from flows.sweep import sweep
from tests.helpers import duplicate_keys, hold_source_lock, sink_lines, summary_of, write_source
from tests.worker_site import WorkerSite

ITEMS = 30


async def test_the_sweeper_crashes_a_silent_run_frees_its_hold_and_spares_live_ones(
    tmp_path: Path, prefect_api: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Running
    from prefect.variables import Variable

    name = "sweep-items"
    with WorkerSite() as site:
        path = write_source(
            tmp_path,
            name=name,
            seeds={"template": site.url("/items/{i}.json"), "range": [0, ITEMS]},
        )
        source = load_source(path)
        # A first run plans everything and stores a few; the rest stays queued.
        first = summary_of(await collect(source=str(path), max_items=5, batch_size=5))
        assert first["stored"] == 5, first
        async with get_client() as client:
            dead, live, unknown = [  # three runs the API shows RUNNING
                str((await client.create_flow_run(
                    collect, parameters={"source": str(path)}, state=Running()
                )).id)
                for _ in range(3)
            ]  # fmt: skip
            now = time.time()
            with open_frontier(source) as frontier:  # the dead run leases 10, the live one 5
                frontier.claim(name, 10, now=now, lease_s=600, holder=dead)
                frontier.beat(name, dead, now=now - HOLDER_DEAD_AFTER_S - 5)
                frontier.claim(name, 5, now=now, lease_s=600, holder=live)
                frontier.beat(name, live, now=now)
            # The dead run holds the source lock with a lease, its beat as silent as its leases.
            lock = await hold_source_lock(name, lease_s=600)
            beat = LockBeat(
                dead, now - HOLDER_DEAD_AFTER_S - 5, "elsewhere/boot", 1, "", lock.lease_id
            )
            await Variable.aset(lock.beat, beat.as_json(), overwrite=True)

            # Judged as of the beats' own clock: on a loaded box, setting up may take longer
            # than the silence that makes a run dead, and would kill the live one too.
            swept = await sweep(client, now=now + 1)

            # The session's Prefect server is shared by this worker's tests: runs other tests
            # left RUNNING (killed on purpose) are swept too, rightly; judge ours only.
            ours = (dead, live, unknown)
            assert [r for r in swept.crashed if r in ours] == [dead], swept
            assert unknown in swept.unjudged, swept
            assert swept.items_returned >= 10, swept
            states = {
                run: (await client.read_flow_run(UUID(run))).state for run in (dead, live, unknown)
            }
            dead_state = states[dead]
            assert dead_state is not None and dead_state.type.value == "CRASHED", dead_state
            assert "no heartbeat" in (dead_state.message or ""), dead_state.message
            assert "dead after" in (dead_state.message or ""), dead_state.message
            assert all(s is not None and s.is_running() for r, s in states.items() if r != dead)
            assert (await client.read_global_concurrency_limit_by_name(lock.name)).active_slots == 0
            assert await Variable.aget(lock.beat) is None
            with open_frontier(source) as frontier:
                held = {h.holder: h.leased for h in frontier.holders(name)}
                assert held.get(dead, 0) == 0 and held[live] == 5, held
                frontier.revoke(name, live, now=time.time())  # the live one ends, as it would

        # The next run takes the lock at once (no wait) and completes the source exactly.
        summary = summary_of(await collect(source=str(path), lock_wait_s=0))
        assert summary["balanced"], summary["problems"]
        rows = sink_lines(tmp_path / "out")
        assert duplicate_keys(rows) == [] and len(rows) == ITEMS, len(rows)


def test_a_holder_on_this_machine_is_dead_at_once_when_its_process_is_gone() -> None:
    import os
    import subprocess
    import sys

    from collector.run.liveness import judge_beat, machine, process_started

    here, now = machine(), time.time()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_started(child.pid) or ""
    child.wait()
    gone = LockBeat("run", now, here, child.pid, started)
    assert judge_beat(gone, now=now, here=here).dead  # fresh beat, process gone: dead at once
    me = LockBeat("run", now - 10, here, os.getpid(), process_started(os.getpid()) or "")
    alive = judge_beat(me, now=now, here=here)
    assert not alive.dead and 19 <= alive.wait_s <= 21, alive
    reused = LockBeat("run", now, here, os.getpid(), "not-my-start")  # the pid was reused
    assert judge_beat(reused, now=now, here=here).dead
    elsewhere = LockBeat("run", now, "other-host/boot", child.pid, started)
    assert not judge_beat(elsewhere, now=now, here=here).dead  # there, only silence counts


@given(age=st.floats(min_value=0, max_value=120), bound=st.floats(min_value=1, max_value=60))
def test_a_holder_elsewhere_is_dead_exactly_when_silent_past_the_bound(
    age: float, bound: float
) -> None:
    from collector.run.liveness import judge_beat

    beat = LockBeat("run", 1_000.0, "other-host/boot", 4242, "1")
    now = 1_000.0 + age
    verdict = judge_beat(beat, now=now, here="this/boot", dead_after_s=bound)
    assert verdict.dead == (now - beat.at > bound)  # the plain rule


def test_the_crashed_message_of_a_signalled_flow_process_says_what_is_known() -> None:
    from flows._dead_runs import exit_message

    prefect_says = (
        "Process exited with status code: -9. Process exited due to a SIGKILL signal. "
        "Typically caused by the operating system terminating the process for exceeding "
        "memory limits, or by manual cancellation."
    )
    said = exit_message(prefect_says, worker="on box (pid 7)")
    assert said is not None and "signal 9 (SIGKILL)" in said and "on box (pid 7)" in said
    assert "memory" not in said
    assert "signal 15 (SIGTERM)" in (exit_message("status code: -15.", worker="w") or "")
    assert exit_message("Process exited with status code: 1.", worker="w") is None
    assert exit_message("Flow run encountered an exception", worker="w") is None
