"""The ``triage`` flow: settle a source's open dead letters (``recovery.triage``), report, tell.

Deployed as ``triage-on-quarantine``, triggered by ``collector.deadletter.quarantined``. The
work is :class:`collector.recovery.triage.Triage` (plain Python); this flow adds the run (so it
shows in
the UI with its parameters), a markdown report and a table per expectation as artifacts, and the
``collector.triage.completed`` event with the outcome counts. Two triage runs may overlap (two
quarantine events close together): each entry is claimed in the store first, so each is settled
by one run only.

A triage that changes things holds the source's lock ``source:<name>`` (``flows/_locks.py``), as
a ``collect`` run does: it re-enqueues and revives dead pages, which a run in progress counts in
its account (a full plan tags the source's dead pages with the run). It waits for a run up to
``locks.wait_s`` and then fails with SourceBusy, having changed nothing; a dry run takes no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.events import emit_event
from prefect.runtime import flow_run
from pydantic import Field

from collector import defaults
from collector.backends import open_archive, open_deadletters, open_frontier, open_sink
from collector.config import Source
from collector.recovery.triage import Triage, TriageReport
from collector.run.stop import process_stop
from flows._dead_runs import say_how_it_crashed
from flows._labels import label_run
from flows._locks import source_lock
from flows.sources import resolve_source

__all__ = ["run_triage", "triage"]


def _artifact_key(source: str, what: str) -> str:
    safe = "".join(ch if ch.isalnum() else "-" for ch in source.lower())
    return f"collector-{safe}-{what}"[:100]


def _triage(source: Source, run_id: str, limit: int, dry_run: bool) -> TriageReport:
    """The triage engine over the source's stores (in a thread: a Ctrl-C reaches it as a stop
    request between entries, see collector.run.stop)."""
    validator = None
    if source.suite_path is not None:
        from collector.settle.validation import SuiteValidator  # GX is imported only where it runs

        validator = SuiteValidator(source.suite_path)
    # A dry run only reads: on a source never run here it makes no store files (status then
    # still says "not run here yet") and takes no sink writer lock beside a run.
    with (
        open_deadletters(source, existing_only=dry_run) as store,
        open_frontier(source, existing_only=dry_run) as frontier,
        open_sink(source, readonly=dry_run) as sink,
    ):
        engine = Triage(
            source,
            store=store,
            archive=open_archive(source),
            frontier=frontier,
            sink=sink,
            run_id=run_id,
            validator=validator,
        )
        return engine.run(limit=limit, dry_run=dry_run, stop=process_stop)


@flow(name="triage", log_prints=False, validate_parameters=True, on_crashed=[say_how_it_crashed])
async def triage(
    source: Annotated[str, Field(description="Path to the source YAML file, or block:<name>.")],
    limit: Annotated[
        int, Field(ge=1, description="Open dead letters looked at in this run.")
    ] = defaults.TRIAGE_LIMIT,
    dry_run: Annotated[bool, Field(description="Decide and report, but change nothing.")] = False,
) -> dict[str, Any]:
    """Repair, replay, re-enqueue or escalate every open dead letter of a source, once."""
    logger = get_run_logger()
    run_id = str(flow_run.get_id() or uuid.uuid4())
    loaded = await asyncio.to_thread(resolve_source, source)
    await label_run("triage", loaded)
    lock: contextlib.AbstractAsyncContextManager[Any] = (
        contextlib.nullcontext(True)
        if dry_run  # changes nothing: no run's account can move
        else source_lock(loaded, holder=run_id, on_busy="wait", wait_s=loaded.locks.wait_s)
    )
    with process_stop.on_signals():
        async with lock:
            report = await asyncio.to_thread(_triage, loaded, run_id, limit, dry_run)
    counts = report.counts()
    logger.info("triage of %s: %s; balance %s", report.source, counts, report.balance.as_dict())
    if not report.balance.balanced:
        logger.error(
            "dead-letter balance of %s fails: %s", report.source, report.balance.difference()
        )
    await acreate_markdown_artifact(
        report.markdown(),
        key=_artifact_key(report.source, "triage"),
        description=f"Triage report of run {run_id}",
    )
    await acreate_table_artifact(
        report.expectation_rows()
        or [{"expectation": "(no record-level dead letters)", "before": 0, "after": 0}],
        key=_artifact_key(report.source, "triage-expectations"),
        description="Per expectation: records failing it before triage and after repair",
    )
    emit_event(
        event="collector.triage.completed",
        resource={"prefect.resource.id": f"collector.source.{report.source}"},
        payload={
            "source": report.source,
            **counts,
            "records_written": report.records_written,
            "dry_run": dry_run,
            "balance": report.balance.as_dict(),
            "run_id": run_id,
        },
    )
    return report.as_dict()


def run_triage(source: str, *, limit: int, dry_run: bool) -> dict[str, Any]:
    """Run the flow in this process (the `collector triage` command); returns the report."""
    process_stop.reset()
    with process_stop.on_signals():
        return asyncio.run(triage(source=source, limit=limit, dry_run=dry_run))
