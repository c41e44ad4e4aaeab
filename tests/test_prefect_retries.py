"""Prefect's retries and timeout of a ``fetch-batch`` task, made to fire on real runs.

The task retries a failed batch twice (``retry_delay_seconds=[1, 5]``, jitter 0.5) unless it
failed for a permanent reason, and times out after ``timeout_seconds``. Each is caused for real
here: the rate limiter's Redis away (a ``BackendError``, transient) on a whole ``collect`` run;
a ``ConfigError`` raised inside the task by the engine's rate limiter (permanent); a local HTTP
server that answers nothing (the timeout). Attempts and delays are read from the task runs'
states in the Prefect API, and the run's account says what became of the retried batch.
"""

from __future__ import annotations

import asyncio
import math
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
    TaskRunFilterName,
    TaskRunFilterState,
    TaskRunFilterStateName,
)
from prefect.client.schemas.objects import State, TaskRun
from prefect.states import Failed
from prefect.utilities.math import lower_clamp_multiple

from collector.config import load_source
from collector.errors import BackendError, ConfigError
from collector.run.collection import Collection
from flows.collect import Batch, _retry_unless_permanent, _RunContext, collect, fetch_batch
from tests.helpers import duplicate_keys, sink_lines, summary_of, write_source
from tests.servers import RedisServer, numbered_pages

JITTER = 0.5  # fetch-batch's retry_jitter_factor
# Prefect's clamped Poisson jitter keeps a delay d within [d x LOW, d x (1 + JITTER)].
LOW = lower_clamp_multiple(1 + JITTER)


def _page(n: int) -> tuple[int, bytes]:
    return 200, f'{{"id": {n}, "name": "item {n}"}}'.encode()


@pytest.fixture
def pages() -> Iterator[str]:
    with numbered_pages(_page) as base:
        yield base


async def _attempts(flow_run_id: uuid.UUID, *, finished: bool = True) -> list[list[State]]:
    """Each fetch-batch task run of the flow run: its states, oldest first (polled: task runs
    reach the API through events, recorded asynchronously)."""
    async with get_client() as client:
        for _ in range(200):
            runs: list[TaskRun] = [
                run
                for run in await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
                )
                if run.name.startswith("fetch-batch")
            ]
            if runs and (not finished or all(r.state and r.state.is_final() for r in runs)):
                histories = [await client.read_task_run_states(run.id) for run in runs]
                return [sorted(h, key=lambda s: s.timestamp) for h in histories]
            await asyncio.sleep(0.1)
    raise AssertionError("no finished fetch-batch task run reached the API")


def _runs(states: list[State]) -> list[State]:
    return [s for s in states if s.is_running()]


def _scheduled_delays(states: list[State]) -> list[float]:
    """The delay Prefect chose for each retry: AwaitingRetry's scheduled time minus its time."""
    return [
        (s.state_details.scheduled_time - s.timestamp).total_seconds()
        for s in states
        if s.name == "AwaitingRetry" and s.state_details.scheduled_time is not None
    ]


def _assert_retried_as_configured(states: list[State]) -> None:
    """Three attempts; the retries' delays within the jitter's bounds around 1 s and 5 s, and
    each retry started no sooner than scheduled."""
    assert len(_runs(states)) == 3, [s.name for s in states]
    delays = _scheduled_delays(states)
    assert len(delays) == 2
    for delay, base in zip(delays, (1.0, 5.0), strict=True):
        assert base * LOW - 0.01 <= delay <= base * (1 + JITTER) + 0.01, delays
    waits = [s for s in states if s.name == "AwaitingRetry"]
    for waiting, started in zip(waits, _runs(states)[1:], strict=True):
        assert waiting.state_details.scheduled_time is not None
        assert started.timestamp >= waiting.state_details.scheduled_time - timedelta(seconds=0.05)


# --- the condition itself (fast) ------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ConfigError("limits.rate_storage: wrong"), False),
        (BackendError("rate limiter: Redis unreachable"), True),
        (TimeoutError("task timed out"), True),
        (RuntimeError("a bug"), True),
    ],
)
async def test_the_retry_condition_refuses_permanent_failures_only(
    error: Exception, retried: bool
) -> None:
    """As Prefect's async engine calls it: the Failed state it made of the exception."""
    decided = _retry_unless_permanent(fetch_batch, None, Failed(data=error))  # type: ignore[arg-type]
    assert await decided is retried


# --- real runs ------------------------------------------------------------------------------
class _FailingLimiter:
    """The engine's rate limiter (collector.fetch.ratelimit's protocol): every acquire raises
    ``error``, as the Redis one raises BackendError when its server stays away."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def acquire(self, key: str) -> None:
        self.calls += 1
        raise self.error

    async def aclose(self) -> None:
        """Nothing to close."""


async def _one_batch(
    source_path: Path, *, limiter: _FailingLimiter | None = None, timeout_s: float | None = None
) -> tuple[uuid.UUID, State, dict[str, Any]]:
    """One leased batch through the real fetch-batch task in a real flow run: its final
    state, and the account after the batch was settled (or given back when it failed)."""
    source = load_source(source_path)

    @flow(name="one-batch")
    async def one_batch() -> tuple[State, dict[str, Any]]:
        with Collection(source, run_id=f"retries-{uuid.uuid4()}") as run:
            run.plan()
            lease = await run.claim(100)
            task = fetch_batch.with_options(timeout_seconds=timeout_s)
            async with run.engine() as engine:
                if limiter is not None:
                    engine.rate_limiter = limiter
                batch = Batch(lease, _RunContext(run, engine))
                called: Any = task(run.run_id, batch, return_state=True)  # a coroutine here
                state: State = await called
            if state.is_completed():
                await run.wait_settled(run.settle(lease, batch.results))
            else:
                await run.release(lease)
            await run.aclose()
            run.finish()
            return state, run.summary().as_dict()

    called: Any = one_batch(return_state=True)  # typed by its function's result by Prefect
    flow_state: State = await called
    task_state, summary = await flow_state.aresult()
    flow_run_id = flow_state.state_details.flow_run_id
    assert flow_run_id is not None
    return flow_run_id, task_state, summary


@pytest.mark.usefixtures("prefect_api")
async def test_a_permanent_failure_is_not_retried(tmp_path: Path, pages: str) -> None:
    source_path = write_source(tmp_path, seeds={"template": pages + "/{i}.json", "range": [0, 3]})
    limiter = _FailingLimiter(ConfigError("limits.rate_storage: no such storage"))
    flow_run_id, state, summary = await _one_batch(source_path, limiter=limiter)

    assert state.is_failed()
    (states,) = await _attempts(flow_run_id)
    assert len(_runs(states)) == 1, [s.name for s in states]  # tried once, never again
    assert _scheduled_delays(states) == []
    assert summary["balanced"] and summary["queued"] == 3 and summary["stored"] == 0


@pytest.mark.usefixtures("prefect_api")
async def test_a_transient_failure_is_retried_twice_with_jitter(tmp_path: Path, pages: str) -> None:
    source_path = write_source(tmp_path, seeds={"template": pages + "/{i}.json", "range": [0, 3]})
    limiter = _FailingLimiter(BackendError("rate limiter redis://127.0.0.1:9: unreachable"))
    flow_run_id, state, summary = await _one_batch(source_path, limiter=limiter)

    assert state.is_failed()  # every attempt failed: retries exhausted
    (states,) = await _attempts(flow_run_id)
    _assert_retried_as_configured(states)
    assert limiter.calls == 3 * 3  # each attempt asked once per item, then the batch failed
    # given back whole: nothing lost, nothing settled, nothing counted twice
    assert summary["balanced"] and summary["queued"] == 3 and summary["stored"] == 0


@pytest.mark.usefixtures("prefect_api")
async def test_the_task_timeout_fires_and_a_timed_out_batch_is_retried(tmp_path: Path) -> None:
    """A server that never answers within the task's timeout (the engine's own deadlines set
    far beyond it, so Prefect's timeout is what ends each attempt)."""
    release = threading.Event()
    asked = 0
    lock = threading.Lock()

    def hang(n: int) -> tuple[int, bytes]:
        nonlocal asked
        with lock:
            asked += 1
        release.wait(60)
        return _page(n)

    with numbered_pages(hang) as base:
        source_path = write_source(
            tmp_path,
            seeds={"urls": [base + "/1.json"]},
            ttl={
                "http_timeout_s": 50,
                "request_deadline_s": 50,
                "batch_timeout_s": 55,
                "lease_s": 120,
            },
        )
        try:
            flow_run_id, state, summary = await _one_batch(source_path, timeout_s=1.0)
        finally:
            release.set()

    assert state.is_failed() and state.name == "TimedOut", state
    (states,) = await _attempts(flow_run_id)
    _assert_retried_as_configured(states)
    ran = _runs(states)
    ended = [s for s in states if s.name in ("AwaitingRetry", "TimedOut")]
    assert len(ended) == 3
    for started, stopped in zip(ran, ended, strict=True):
        lasted = (stopped.timestamp - started.timestamp).total_seconds()
        assert 1.0 <= lasted < 30, lasted  # the 1 s timeout, not the engine's 50 s deadline
    assert asked == 3  # one request per attempt: each attempt fetched the batch again
    assert summary["balanced"] and summary["queued"] == 1 and summary["stored"] == 0


@pytest.mark.usefixtures("prefect_api")
async def test_a_batch_retried_on_a_real_run_settles_each_item_once(
    tmp_path: Path, pages: str
) -> None:
    """A whole ``collect`` run whose rate limiter's Redis is away for the batch's first two
    attempts (BackendError) and back before the third: the batch is retried as configured, and
    the run's account balances with every item stored once."""
    redis = RedisServer()  # its port is free: nothing answers there until it starts
    source_path = write_source(
        tmp_path,
        seeds={"template": pages + "/{i}.json", "range": [0, 4]},
        limits={"per_domain_rate": "1000/second", "rate_storage": redis.url},
        name=f"retried-{uuid.uuid4().hex[:8]}",
    )
    source = load_source(source_path)

    async def start_redis_after_the_second_failure() -> None:
        """Polls the API: once the batch's task run waits for its second retry, Redis starts
        (the third attempt is due 3 s later at the earliest)."""
        waiting = TaskRunFilter(
            name=TaskRunFilterName(like_=f"fetch-batch[{source.name}]"),
            state=TaskRunFilterState(name=TaskRunFilterStateName(any_=["AwaitingRetry"])),
        )
        async with get_client() as client:
            while not any(
                r.run_count >= 2 for r in await client.read_task_runs(task_run_filter=waiting)
            ):
                await asyncio.sleep(0.05)
        await asyncio.to_thread(redis.start)

    waiter = asyncio.create_task(start_redis_after_the_second_failure())
    try:
        state = await collect(source=str(source_path), batch_size=10, return_state=True)
    finally:
        waiter.cancel()
        redis.__exit__(None, None, None)
    assert isinstance(state, State) and state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None

    (states,) = await _attempts(flow_run_id)
    _assert_retried_as_configured(states)
    summary = summary_of(await state.aresult())
    assert summary["balanced"], summary
    assert summary["discovered"] == 4 and summary["stored"] == 4 and summary["queued"] == 0
    assert summary["batches"] == 1
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == 4 and duplicate_keys(rows) == []


def test_jitter_bounds_are_prefects() -> None:
    """The bounds the tests hold the delays to are Prefect's own clamp for a factor of 0.5."""
    assert fetch_batch.retry_jitter_factor == JITTER
    assert list(fetch_batch.retry_delay_seconds or []) == [1, 5]
    assert fetch_batch.retries == 2
    assert math.isclose(LOW, math.log2(2**1.5 / (2**1.5 - 1)))
