"""The ``collect`` flow: plan, then claim / fetch / settle batches until the frontier drains.

Each batch is one Prefect task run (``fetch-batch``): Prefect's per-task cost (~7-15 ms) is paid
per batch, not per page, and ``batch_size=1`` gives one task per URL for full visibility. The
task's ``timeout_seconds`` is the source's execution TTL; Prefect retries it (with jitter) for
systemic failures only: ``retry_condition_fn`` refuses permanent errors. Per-URL failures never
fail the task; they are decided in ``settle`` (retry later, or dead letters).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.settings import PREFECT_CLIENT_METRICS_ENABLED
from prefect.states import Cancelled, Failed, aget_state_exception
from pydantic import Field

from collector import defaults
from collector.config import Source
from collector.errors import (
    CollectorError,
    ConfigError,
    ConservationError,
    PermanentFetchError,
    RunFailed,
)
from collector.fetch.engine import FetchEngine, FetchResult, host_of
from collector.frontier import Lease
from collector.ops import metrics
from collector.ops.observability import init_sentry
from collector.ops.tracing import init_tracing
from collector.run.account import END_TERMS, INTAKE_TERMS, REPORTED_TERMS
from collector.run.collection import BatchReport, Run
from collector.run.drain import DrainPolicy, drain
from collector.run.locks import host_slots
from collector.run.stop import LostFooting, process_stop
from collector.run.summary import RunSummary, host_line
from flows._dead_runs import say_how_it_crashed
from flows._helper_report import HelperReport
from flows._labels import label_run
from flows._locks import domain_slots, source_lock
from flows.sources import resolve_source, source_reference

__all__ = ["collect", "listening"]

Role = Literal["run", "work"]
ProgressListener = Callable[[str, dict[str, Any]], None]
_log = logging.getLogger(__name__)
RunLogger = logging.Logger | logging.LoggerAdapter[logging.Logger]  # get_run_logger()'s
_run_listeners: ContextVar[tuple[ProgressListener, ...]] = ContextVar(
    "collector_run_listeners", default=()
)
"""The listeners of the runs started in this context (``run_collect(listeners=...)``,
:func:`listening`): the flow and its tasks run in copies of the caller's context, so they see
them; runs started elsewhere in the process do not (no process-wide list)."""


@contextlib.contextmanager
def listening(*listeners: ProgressListener) -> Iterator[None]:
    """Tell ``listeners`` ``(event, data)`` of every collect run started inside the block from
    this context (a test's recorder around ``await collect(...)``)."""
    told = _run_listeners.set((*_run_listeners.get(), *listeners))
    try:
        yield
    finally:
        _run_listeners.reset(told)


class _CancelledIsNotAnError(logging.Filter):
    """Prefect's flow engine logs a run's final state at ERROR unless it is Completed; a run
    the user stopped (Ctrl-C, SIGTERM, Cancel in the UI) ends Cancelled on purpose, with its
    summary said: that line is lowered to WARNING (console and UI alike). Failed stays ERROR.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and str(record.msg).startswith(
            "Finished in state Cancelled"
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


logging.getLogger("prefect.flow_runs").addFilter(_CancelledIsNotAnError())


@dataclass(frozen=True, slots=True)
class _RunContext:
    """The live objects of one run a ``fetch-batch`` task needs (clients, files): they travel
    in the task's :class:`Batch`, which Prefect neither walks nor stores."""

    run: Run
    engine: FetchEngine


def _listeners() -> tuple[ProgressListener, ...]:
    return _run_listeners.get()


def _tell(event: str, **data: Any) -> None:
    for listener in _listeners():
        listener(event, data)


def _lock_busy(logger: RunLogger, why: str) -> None:
    """Said once when the source lock is taken and the run starts waiting for it (a warning:
    the CLI's console shows warnings only, and a rerun after a crash waits here up to 30 s)."""
    logger.warning(why)
    _tell("lock_busy", why=why)


def _tell_fetched(result: FetchResult) -> None:
    _tell("fetched", status=result.status, decision=result.decision)


def _circuit_events(source: str, run_id: str) -> Callable[[str, dict[str, Any]], None]:
    """Circuit breaker transitions as Prefect events ``collector.circuit.opened`` / ``.closed``
    on resource ``collector.host.<host>``, for the UI's event feed and automations."""

    def emit(kind: str, data: dict[str, Any]) -> None:
        emit_event(
            event=f"collector.circuit.{kind}",
            resource={"prefect.resource.id": f"collector.host.{data['host']}"},
            related=[
                {
                    "prefect.resource.id": f"collector.source.{source}",
                    "prefect.resource.role": "source",
                }
            ],
            payload={**data, "source": source, "run_id": run_id},
        )
        _tell("circuit", kind=kind, **data)

    return emit


async def _retry_unless_permanent(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect retry condition: never retry a batch that failed for a permanent reason.

    Async on purpose: in Prefect's async task engine ``state.result()`` is a coroutine, so a
    synchronous condition would see nothing raised and retry everything; the engine awaits an
    awaitable condition. The state is the Failed one the engine made of the exception (a
    timeout included: a timed-out batch is retried).
    """
    failure = await aget_state_exception(state)
    return not isinstance(failure, (PermanentFetchError, ConfigError))


@task(
    name="fetch-batch",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=[1, 5],
    retry_jitter_factor=0.5,
    retry_condition_fn=_retry_unless_permanent,
)
async def fetch_batch(run_key: str, batch: Batch) -> Batch:
    """Fetch one leased batch and return it with a result per URL (``run_key`` names the run
    in the task's parameters; the run itself travels in the batch)."""
    context = batch.context
    batch.results = await context.run.fetch(context.engine, batch.lease, batch.host_slots)
    return batch


class Batch:
    """A leased batch and, once fetched, its results.

    Deliberately not a dataclass or a collection: Prefect walks task parameters and return
    values looking for futures and states (``visit_collection``), which for 500 items and their
    bodies costs milliseconds per batch for nothing.
    """

    __slots__ = ("context", "host_slots", "lease", "results")

    def __init__(
        self, lease: Lease, context: _RunContext, host_slots: dict[str, int] | None = None
    ) -> None:
        self.lease = lease
        self.context = context
        self.host_slots = host_slots  # slots granted by shared domain:<host> limits, if any
        self.results: list[FetchResult] = []

    def __repr__(self) -> str:
        return f"Batch(token={self.lease.token}, items={len(self.lease.items)})"


def _dead_letter_markdown(summary: RunSummary) -> str:
    reasons = summary.deadletter_reasons
    lines = [f"# Dead letters of `{summary.source}`", ""]
    if not reasons:
        lines.append("No open dead letters.")
    for reason, count in reasons.items():
        lines.append(f"- **{reason}**: {count}")
    lines += ["", f"Store: `{summary.deadletters}`", f"Archive: `{summary.deadletter_archive}`"]
    return "\n".join(lines)


def _report_failed_run(flow: Any, flow_run: Any, state: State[Any]) -> None:
    """on_failure hook: one Sentry event for the failed run (no-op without SENTRY_DSN)."""
    from collector.ops import observability

    metrics.run_ended(str(flow_run.id), "failed")  # no-op if the flow counted it already
    if not observability.sentry_enabled():
        return
    path = str((flow_run.parameters or {}).get("source", ""))
    try:
        loaded = resolve_source(path)
        observability.register_secrets(loaded.secret_values())
        name = loaded.name
    except Exception:
        name = path
    data = getattr(state, "data", None)
    error = getattr(data, "result", data)
    observability.capture_failed_run(
        source=name,
        flow_run_id=str(flow_run.id),
        error=error if isinstance(error, BaseException) else None,
        message=state.message or "",
    )


@flow(
    name="collect",
    log_prints=False,
    validate_parameters=True,
    on_failure=[_report_failed_run],
    on_crashed=[say_how_it_crashed],
)
async def collect(
    source: Annotated[
        str,
        Field(description="Path to the source YAML file, or block:<CollectorSource block name>."),
    ],
    batch_size: Annotated[
        int, Field(ge=1, le=10_000, description="Items claimed, fetched and stored per task.")
    ] = defaults.BATCH_SIZE,
    max_items: Annotated[
        int | None, Field(ge=1, description="Stop after claiming this many items.")
    ] = None,
    drain_wait_s: Annotated[
        float,
        Field(ge=0, description="How long to wait for retry-later items and others' leases."),
    ] = defaults.DRAIN_WAIT_S,
    role: Annotated[
        Role,
        Field(
            description="run: plan and drain under the source:<name> lock; work: only help "
            "drain the shared frontier (no plan, no source lock, a ledger of what it claimed)."
        ),
    ] = "run",
    on_busy: Annotated[
        Literal["wait", "skip"] | None,
        Field(description="When another run holds the source lock (default: locks.on_busy)."),
    ] = None,
    lock_wait_s: Annotated[
        float | None,
        Field(ge=0, description="How long `wait` waits for the lock (default: locks.wait_s)."),
    ] = None,
    idle_wait_s: Annotated[
        float,
        Field(ge=0, description="work: how long to wait for items when the frontier is empty."),
    ] = 0.0,
) -> dict[str, Any] | State[Any]:
    """Collect one source: plan its URLs, fetch them in leased batches, store, account.

    The first SIGINT/SIGTERM (a Ctrl-C, a cancellation from the UI through a process worker)
    stops the run gracefully (collector.run.stop): the run settles what it fetched, gives the
    rest back to the queue, releases its lock, publishes its summary and ends Cancelled.
    """
    logger = get_run_logger()
    init_sentry()  # once per process, only when SENTRY_DSN is set
    init_tracing()  # once per process, only when OTEL_* asks for export
    metrics.enable(metrics.enabled() or bool(PREFECT_CLIENT_METRICS_ENABLED.value()))
    loaded = resolve_source(source)
    await label_run(role, loaded)  # named and tagged by its source, local or deployed
    run_id = str(flow_run.get_id() or uuid.uuid4())
    metrics.run_started(run_id, loaded.name, role)
    lock: contextlib.AbstractAsyncContextManager[Any] = (
        source_lock(
            loaded,
            holder=run_id,
            on_busy=on_busy or loaded.locks.on_busy,
            wait_s=loaded.locks.wait_s if lock_wait_s is None else lock_wait_s,
            on_wait=functools.partial(_lock_busy, logger),
        )
        if role == "run"
        else contextlib.nullcontext(True)
    )
    policy = DrainPolicy(
        batch_size=batch_size,
        max_items=max_items,
        drain_wait_s=drain_wait_s,
        idle_wait_s=0.0 if role == "run" else idle_wait_s,
    )
    lock = metrics.TimedLock(lock, loaded.name) if role == "run" else lock  # lock wait seconds
    with process_stop.on_signals():
        async with lock as acquired:
            if not acquired:
                logger.warning("skipped: another run of %s holds its source lock", loaded.name)
                metrics.run_ended(run_id, "skipped")
                skipped = RunSummary(
                    source=loaded.name, run_id=run_id, role=role, ending="skipped", skipped="busy"
                )
                return skipped.as_dict()
            async with _reporting(role):
                summary = await _collect(
                    loaded, run_id, role, policy, logger, source_reference(source)
                )
            summary = summary.with_(source_path=source_reference(source))  # triggered triage
    await _publish(summary)
    return _final_state(summary, run_id, logger)


@contextlib.asynccontextmanager
async def _reporting(role: Role) -> AsyncIterator[None]:
    """A helper in a flow run reports its CPU share to the fleet (flows/_helper_report.py);
    a run, or a helper outside Prefect (`collector work`), reports nothing."""
    run_id = flow_run.get_id()
    if role != "work" or not run_id:
        yield
        return
    report = HelperReport(str(run_id)).__enter__()
    try:
        yield
    finally:
        await asyncio.to_thread(report.__exit__)  # a report in flight is waited for off the loop


def _final_state(
    summary: RunSummary, run_id: str, logger: RunLogger
) -> dict[str, Any] | State[Any]:
    """How the run ends in Prefect, its summary travelling in it: Completed (the summary),
    Cancelled (stopped; the summary as data), Failed (``RunFailed`` or ``ConservationError``
    carrying it). Counted in the metrics the same way."""
    result = metrics.result_of(summary.balanced, summary.interrupted)
    if result == "ok" and (summary.all_refused or summary.hosts_down):
        result = "failed"  # the run ends Failed below: not a success for the metrics either
    metrics.run_ended(run_id, result)
    if summary.interrupted:
        logger.warning(summary.interruption)
        return Cancelled(message=summary.interruption, data=summary.as_dict())
    if not summary.balanced:
        logger.error("ledger does not balance: %s", "; ".join(summary.problems))
        said = "ledger does not balance: " + "; ".join(summary.problems)
        raise ConservationError(said, summary.as_dict())
    if summary.all_refused:  # a source that cannot collect anything: Failed, so it is noticed
        logger.error(summary.refused_all)
        return _failed(summary.refused_all, summary)
    if summary.hosts_down:  # a dead site is not a success: Failed, so automations see it
        message = "; ".join(
            [summary.hosts_down_line]
            + [host_line(host, facts) for host, facts in summary.hosts_down.items()]
        )
        logger.error(message)
        return _failed(message, summary)
    return summary.as_dict()


def _failed(message: str, summary: RunSummary) -> State[Any]:
    """A Failed final state whose data is the exception a caller gets, summary included (a
    dict there would make Prefect's in-process call fail with its own TypeError)."""
    return Failed(message=message, data=RunFailed(message, summary.as_dict()))


async def _collect(
    loaded: Source,
    run_id: str,
    role: Role,
    policy: DrainPolicy,
    logger: RunLogger,
    source_path: str = "",
) -> RunSummary:
    """Plan (role run), drain and account one source, under its lock when it has one."""
    fetch_task = fetch_batch.with_options(
        name=f"fetch-batch[{loaded.name}]", timeout_seconds=loaded.ttl.batch_timeout_s
    )
    planned = role == "run"
    async with Run.open(loaded, run_id=run_id) as run:  # stores opened and closed off the loop
        if planned:
            ledger = await run.stores.frontier.lane.run(run.plan)  # off the loop
            to_fetch = ledger.to_fetch
            logger.info(
                "planned %s (%s): %d discovered, %d fresh, %d already dead, %d unlisted "
                "(%d retired), %d to fetch",
                loaded.name, ledger.plan, ledger.discovered, ledger.fresh_skipped,
                ledger.dead_lettered, ledger.unlisted, ledger.retired, to_fetch,
            )  # fmt: skip
        else:
            to_fetch = (await run.stores.frontier.counts(loaded.name)).queued
        _tell("planned", discovered=run.ledger.discovered, to_fetch=to_fetch)
        progress = await _ProgressArtifact.create(run, to_fetch)

        async def fetch(lease: Lease) -> list[FetchResult]:
            async with _batch_slots(run, lease, run_id) as slots:
                return (await fetch_task(run_id, Batch(lease, context, slots))).results

        async def listen(event: str, data: dict[str, Any]) -> None:
            _tell(event, **data)
            if event == "batch":
                await progress.update()

        lost: LostFooting | None = None
        async with run.engine(
            # per-item progress for the terminal (`collector run`)
            on_item=_tell_fetched if _listeners() else None,
            circuit_listeners=[_circuit_events(loaded.name, run_id)],
        ) as engine:
            context = _RunContext(run, engine)
            try:
                end = await drain(run, fetch, policy, stop=process_stop, listener=listen)
            except LostFooting as exc:  # everything it could settle is settled: said below
                lost = exc
            finally:
                await run.aclose()
        await progress.update(final=True)
        if lost is not None:
            metrics.run_ended(run_id, "failed")
            lost.summary = await _publish_lost(
                run, lost, role=role, planned=planned, source_path=source_path
            )
            raise lost
        if end.held_by_others and end.ending != "drained":
            logger.warning(
                "%s: ended (%s) while helpers still hold %d items; they settle them",
                loaded.name, end.ending, end.held_by_others,
            )  # fmt: skip
        # the end state and the stores' counts are read on their lanes, as every store call
        return await run.end(
            planned=planned, role=role, ending=end.ending, interrupted=end.stop_reason
        )


async def _publish_lost(
    run: Run, lost: LostFooting, *, role: Role, planned: bool, source_path: str
) -> RunSummary | None:
    """What a run that lost its footing settled, published before it ends Failed (the ledger
    and dead-letter artifacts, the quarantine event): its books closed when the stores still
    answer, else its account as settled, marked unchecked. Returns it (None: it could not be
    made). Never raises: the loss is what the run ends with."""
    how: dict[str, Any] = {"role": role, "ending": "lost", "lost": lost.lost}
    summary: RunSummary | None = None
    try:
        try:
            summary = await run.end(planned=planned, **how)
        except CollectorError as exc:  # the store went away with its footing
            unchecked = {"balanced": False, "problems": (f"not checked: {exc}",)}
            summary = (await run.summarize(**how)).with_(**unchecked)
        summary = summary.with_(source_path=source_path)
        await _publish(summary)
    except Exception as exc:
        _log.warning("%s: what the run settled was not published: %s", run.source.name, exc)
    return summary


@contextlib.asynccontextmanager
async def _batch_slots(run: Run, lease: Lease, run_id: str) -> AsyncIterator[Any]:
    """The batch's shared ``domain:<host>`` slots when enabled, else no cap (None)."""
    if not run.source.limits.shared_domain_concurrency:
        yield None
        return
    wanted = host_slots(
        (host_of(item.url) for item in lease.items), run.source.limits.per_domain_concurrency
    )
    waiting = time.monotonic()
    async with domain_slots(run.source, wanted, holder=run_id) as granted:
        metrics.host_slots_waited(run.source.name, time.monotonic() - waiting)
        yield granted


class _ProgressArtifact:
    """The run's progress bar in the UI, updated at most every PROGRESS_EVERY_S.

    Each update is an API round trip (~70 ms measured against the ephemeral server, most of it
    CPU shared with the fetch loop), so it is throttled by time, not sent per batch.
    """

    def __init__(self, run: Run, to_fetch: int, artifact_id: Any) -> None:
        self.run = run
        self.to_fetch = to_fetch
        self.artifact_id = artifact_id
        self.sent_at = time.monotonic()

    @classmethod
    async def create(cls, run: Run, to_fetch: int) -> _ProgressArtifact:
        artifact_id = await acreate_progress_artifact(
            0.0, key=_artifact_key(run.source.name, "progress"), description="Items settled"
        )
        return cls(run, to_fetch, artifact_id)

    async def update(self, *, final: bool = False) -> None:
        if not final and time.monotonic() - self.sent_at < defaults.PROGRESS_EVERY_S:
            return
        done = self.run.ledger.settled_items
        # A run with nothing to fetch is complete, not stuck at 0 %.
        percent = min(100.0, 100.0 * done / self.to_fetch) if self.to_fetch > 0 else 100.0
        self.sent_at = time.monotonic()
        await aupdate_progress_artifact(self.artifact_id, percent)


def _artifact_key(source: str, what: str) -> str:
    safe = "".join(ch if ch.isalnum() else "-" for ch in source.lower())
    return f"collector-{safe}-{what}"[:100]


def ledger_artifact_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """The ledger artifact's rows, from the account's terms (collector.run.account): every
    term of the balance (intake, then terminal states), the reported details, then requests,
    throughput, the verdict and how the run ended."""
    terms = (*INTAKE_TERMS, *END_TERMS, *REPORTED_TERMS)
    why = summary.interrupted or summary.lost
    ending = summary.ending + (f" ({why})" if why else "")
    return [
        *({"count": t.name, "value": getattr(summary, t.name)} for t in terms),
        {"count": "requests", "value": summary.requests},
        {"count": "pages_per_second", "value": summary.pages_per_second},
        {"count": "balanced", "value": summary.balanced},
        {"count": "ended", "value": ending},
    ]


async def _publish(summary: RunSummary) -> None:
    """Artifacts for the Prefect UI and an event when new dead letters appeared."""
    await acreate_table_artifact(
        ledger_artifact_rows(summary),
        key=_artifact_key(summary.source, "summary"),
        description=f"Ledger of run {summary.run_id}",
    )
    await acreate_markdown_artifact(
        _dead_letter_markdown(summary),
        key=_artifact_key(summary.source, "deadletters"),
        description="Open dead letters by stage/reason",
    )
    if summary.quarantined:
        emit_event(
            event="collector.deadletter.quarantined",
            resource={"prefect.resource.id": f"collector.source.{summary.source}"},
            payload={
                "source": summary.source,
                "items": summary.dead_lettered - summary.already_dead,
                "records": summary.records_quarantined,
                "reasons": summary.deadletter_reasons,
                "run_id": summary.run_id,
                "source_path": summary.source_path,  # what the triage flow is given
            },
        )


def run_collect(
    source: str,
    *,
    batch_size: int,
    max_items: int | None,
    drain_wait_s: float,
    role: Role = "run",
    on_busy: Literal["wait", "skip"] | None = None,
    lock_wait_s: float | None = None,
    idle_wait_s: float = 0.0,
    listeners: Sequence[ProgressListener] = (),
) -> RunSummary:
    """Run the flow in this process (`collector run` / `collector work`); returns the summary.
    ``listeners`` are told this run's progress (``(event, data)``, see :func:`_tell`).

    The first SIGINT/SIGTERM stops the run gracefully (its summary says ``interrupted``); the
    second exits the process at once.
    """
    started = time.monotonic()
    # A request made before this call (the CLI installs the handlers as the command starts) is
    # this run's: it is consumed when the run ends, not forgotten as it starts.
    try:
        with listening(*listeners), process_stop.on_signals():
            state: Any = asyncio.run(
                collect(  # type: ignore[arg-type]  # typed Awaitable by Prefect; a coroutine
                    source=source,
                    batch_size=batch_size,
                    max_items=max_items,
                    drain_wait_s=drain_wait_s,
                    role=role,
                    on_busy=on_busy,
                    lock_wait_s=lock_wait_s,
                    idle_wait_s=idle_wait_s,
                    return_state=True,
                )
            )
    finally:
        process_stop.reset()
    summary = summary_in(state)
    if summary is None:
        # The flow failed before it had a summary (a backend down, a busy lock, a stop while
        # waiting): raise its own error, as calling the flow without return_state would.
        state.result(raise_on_failure=True)
        raise CollectorError(f"the collect flow ended {state.type.value} without a summary")
    return summary.with_(wall_seconds=round(time.monotonic() - started, 3))


def summary_in(state: State[Any]) -> RunSummary | None:
    """The run's summary from the flow run's final state: its result (Completed, skipped),
    its data (Cancelled: the run was stopped), or the summary its exception carries (Failed:
    ``RunFailed``, ``ConservationError``). None when the run ended before it had one."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, dict):
        return RunSummary.from_dict(data)
    carried = getattr(data, "summary", None)
    return RunSummary.from_dict(carried) if isinstance(carried, dict) and carried else None


__all__ += ["BatchReport", "CollectorError", "RunSummary", "run_collect"]
