"""The ``compensate`` and ``audit`` flows: undoing written batches, as Prefect runs.

The work is plain Python (:func:`collector.recovery.compensation.compensate_batch`,
:func:`collector.recovery.audit.audit`); these flows add the run (deployable, started from the
UI's "Custom run" form, the CLI or an event, with its parameters shown), a markdown report and a
table as artifacts, an event with the outcome, and a run name and tags saying which source and
which role (``compensate-<source>-<batch>``, ``audit-<source>``; tags ``collector``, the role,
``source:<name>``, ``class:<class>``: ``flows/_labels.py``), so the runs of one source's recovery
are found together. ``collector compensate`` and ``collector
audit`` run them in the command's process, as ``collector triage`` runs the triage flow.

Neither takes the source's lock (as before they were flows): removing records and making done
pages stale changes no run's account, and a replacement is written under a fresh fencing
token, so a run in progress cannot overwrite it with an older one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import uuid
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.events import emit_event
from prefect.runtime import flow_run
from pydantic import Field

from collector._text import counted
from collector.backends import open_backends
from collector.config import Source
from collector.errors import CollectorError, ConfigError
from collector.recovery.audit import AuditReport
from collector.recovery.compensation import CompensationReport
from flows._dead_runs import say_how_it_crashed
from flows._labels import label_run
from flows.sources import resolve_source

__all__ = ["audit", "compensate", "run_audit", "run_compensate"]


def _artifact_key(source: str, what: str) -> str:
    safe = "".join(ch if ch.isalnum() else "-" for ch in source.lower())
    return f"collector-{safe}-{what}"[:100]


def _validator(source: Source) -> Any:
    if source.suite_path is None:
        return None
    from collector.settle.validation import SuiteValidator  # GX is imported only where it runs

    return SuiteValidator(source.suite_path)


def _compensate(
    source: Source,
    run_id: str,
    batch: str,
    reason: str,
    by: str,
    replacements: list[dict[str, Any]],
    dry_run: bool,
) -> tuple[CompensationReport, str, str]:
    from collector.recovery.compensation import compensate_batch
    from collector.run.ledger import LedgerBook

    validator = _validator(source) if replacements else None
    book = LedgerBook(source.ledger_path)
    with open_backends(source) as stores:
        batch = _full_id(batch, stores.sink.batches(), book, source, stores.sink.location())
        report = compensate_batch(
            source,
            sink=stores.sink,
            book=book,
            deadletters=stores.deadletters,
            frontier=stores.frontier,
            validator=validator,
            batch_id=batch,
            reason=reason,
            by=by,
            run_id=run_id,
            replacements=replacements,
            dry_run=dry_run,
        )
        return report, stores.sink.location(), stores.deadletters.location()


def _full_id(batch: str, held: list[str], book: Any, source: Source, where: str) -> str:
    """The full id a unique abbreviation names (a run started from the UI with one; the CLI
    resolves before it starts the flow): collector.recovery.batch_ids."""
    from collector.recovery.batch_ids import resolve_written_batch

    return resolve_written_batch(batch, held, book, source.name, where=where)


@flow(
    name="compensate", log_prints=False, validate_parameters=True, on_crashed=[say_how_it_crashed]
)
async def compensate(
    source: Annotated[str, Field(description="Path to the source YAML file, or block:<name>.")],
    batch: Annotated[str, Field(min_length=1, description="Batch id (see collector batches).")],
    reason: Annotated[str, Field(min_length=1, description="Why; kept in the ledger.")],
    replacements: Annotated[
        list[dict[str, Any]] | None,
        Field(
            description="Corrected records for keys of the batch: written if they pass the "
            "source's suite, sent to manual review if not. None: the batch is only removed."
        ),
    ] = None,
    dry_run: Annotated[bool, Field(description="Check and report, but change nothing.")] = False,
    by: Annotated[str, Field(description="Who asked, for the ledger (default: this run).")] = "",
) -> dict[str, Any]:
    """Undo exactly one batch's writes; write back the replacements that pass the suite."""
    logger = get_run_logger()
    run_id = str(flow_run.get_id() or uuid.uuid4())
    loaded = await asyncio.to_thread(resolve_source, source)
    await label_run("compensate", loaded, batch)
    report, where, review = await asyncio.to_thread(
        _compensate, loaded, run_id, batch, reason.strip(), by or f"flow run {run_id}",
        replacements or [], dry_run,
    )  # fmt: skip
    data = {**report.as_dict(), "sink": where, "ledger": str(loaded.ledger_path),
            "review_store": review, "run_id": run_id}  # fmt: skip
    logger.info(
        "compensation of %s batch %s: %s, removed %s, replacements written %d, to review %d",
        loaded.name, batch, report.status, report.removed, len(report.written), len(report.review),
    )  # fmt: skip
    await acreate_markdown_artifact(
        report.markdown(),
        key=_artifact_key(loaded.name, "compensate"),
        description=f"Compensation of batch {batch} (run {run_id})",
    )
    await acreate_table_artifact(
        report.rows() or [{"key": "(no replacements)", "outcome": "-", "detail": "-"}],
        key=_artifact_key(loaded.name, "compensate-records"),
        description="Per replacement record: written, unchanged, superseded, or sent to review",
    )
    emit_event(
        event="collector.compensate.completed",
        resource={"prefect.resource.id": f"collector.source.{loaded.name}"},
        payload={k: data[k] for k in ("source", "batch_id", "status", "removed", "run_id")}
        | {"written": len(report.written), "review": len(report.review), "dry_run": dry_run},
    )
    if report.status == "missing":
        raise CollectorError(f"batch {batch}: not in {where} (never written, or overwritten)")
    return data


def _audit(
    source: Source, batches: list[str] | None, dry_run: bool, by: str
) -> tuple[AuditReport, str]:
    from collector.recovery.audit import audit as audit_batches
    from collector.run.ledger import LedgerBook

    validator = _validator(source)
    if validator is None:
        raise ConfigError(f"{source.name}: validation.suite: the source has no suite to audit with")
    # a dry run only reads: no store files made for a source never run here, no writer lock
    book = LedgerBook(source.ledger_path)
    with open_backends(source, readonly_sink=dry_run, existing_only=dry_run) as stores:
        if batches:
            held, where = stores.sink.batches(), stores.sink.location()
            batches = [_full_id(b, held, book, source, where) for b in batches]
        report = audit_batches(
            stores.sink,
            validator,
            book,
            source=source.name,
            batch_ids=batches,
            dry_run=dry_run,
            by=by,
            frontier=stores.frontier,
        )
        return report, stores.sink.location()


def _audit_markdown(report: AuditReport, where: str) -> str:
    verb = "would compensate" if report.dry_run else "compensated"
    checked = counted(len(report.batches), "batch")
    lines = [f"# Audit of {report.source}\n", f"{checked} checked in {where},"
             f" {len(report.failed)} failing table-level expectations.\n"]  # fmt: skip
    for batch in report.failed:
        names = ", ".join(f["expectation"] for f in batch.failed)
        removed = "" if batch.removed is None else f" ({counted(batch.removed, 'record')} removed)"
        lines.append(f"- `{batch.batch_id}` fails {names}: {verb}{removed}")
    for batch in report.batches:
        if batch.rows_failing:
            lines.append(f"- `{batch.batch_id}`: {batch.rows_failing} records fail row-level"
                         " expectations (reported only)")  # fmt: skip
    return "\n".join(lines) + "\n"


@flow(name="audit", log_prints=False, validate_parameters=True, on_crashed=[say_how_it_crashed])
async def audit(
    source: Annotated[str, Field(description="Path to the source YAML file, or block:<name>.")],
    batches: Annotated[
        list[str] | None, Field(description="Only these batch ids (default: every batch).")
    ] = None,
    dry_run: Annotated[bool, Field(description="Report only, remove nothing.")] = False,
    by: Annotated[str, Field(description="Who asked, for the ledger (default: this run).")] = "",
) -> dict[str, Any]:
    """Check the batches in the sink with the current suite; compensate those failing it."""
    logger = get_run_logger()
    run_id = str(flow_run.get_id() or uuid.uuid4())
    loaded = await asyncio.to_thread(resolve_source, source)
    await label_run("audit", loaded)
    report, where = await asyncio.to_thread(
        _audit, loaded, batches or None, dry_run, by or f"audit:flow run {run_id}"
    )
    data = {**report.as_dict(), "sink": where, "ledger": str(loaded.ledger_path), "run_id": run_id}
    logger.info(
        "audit of %s: %d batches, %d failing, %d compensated",
        loaded.name, len(report.batches), len(report.failed), len(report.compensated),
    )  # fmt: skip
    await acreate_markdown_artifact(
        _audit_markdown(report, where),
        key=_artifact_key(loaded.name, "audit"),
        description=f"Audit report of run {run_id}",
    )
    await acreate_table_artifact(
        [
            {"batch": b.batch_id, "records": b.records,
             "failed": ", ".join(f["expectation"] for f in b.failed) or "-",
             "rows_failing": b.rows_failing,
             "removed": "-" if b.removed is None else b.removed}
            for b in report.batches
        ] or [{"batch": "(no batches)", "records": 0, "failed": "-", "rows_failing": 0,
               "removed": "-"}],
        key=_artifact_key(loaded.name, "audit-batches"),
        description="Per batch: records, table-level failures, row-level failures, removed",
    )  # fmt: skip
    emit_event(
        event="collector.audit.completed",
        resource={"prefect.resource.id": f"collector.source.{loaded.name}"},
        payload={k: data[k] for k in ("source", "audited", "failed", "compensated", "removed")}
        | {"dry_run": dry_run, "run_id": run_id},
    )
    return data


def _run_here(flow_call: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
    """Run a flow to its end from synchronous code: in this thread, or, when this thread runs an
    event loop already (``main([...])`` called from async code), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(flow_call())
    context = contextvars.copy_context()  # the settings in force here (the API's URL) go along
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(context.run, lambda: asyncio.run(flow_call())).result()


def run_compensate(
    source: str, *, batch: str, reason: str, by: str, replacements: list[dict[str, Any]]
) -> dict[str, Any]:
    """Run the flow in this process (``collector compensate``); returns its report."""
    return _run_here(
        lambda: compensate(
            source=source, batch=batch, reason=reason, replacements=replacements, by=by
        )
    )


def run_audit(source: str, *, batches: list[str], dry_run: bool, by: str) -> dict[str, Any]:
    """Run the flow in this process (``collector audit``); returns its report."""
    return _run_here(lambda: audit(source=source, batches=batches or None, dry_run=dry_run, by=by))
