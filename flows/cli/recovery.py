"""``collector triage``, ``compensate`` and ``audit``: mending what was stored or failed."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collector import defaults
from collector._text import counted
from collector.errors import CollectorError, ConfigError
from flows.cli._common import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_OK,
    _prefect_environment,
    _prefect_server,
    add_json,
    add_source,
    load,
    positive_int,
    when,
)

if TYPE_CHECKING:
    from collector.config import Source
    from collector.sinks.base import BatchSummary
    from flows.cli._common import Commands

T = TypeVar("T")


def operator_name() -> str:
    """Who ran the command, for the ledger: the login name, else the uid (never empty)."""
    try:
        return getpass.getuser()  # LOGNAME, USER, LNAME, USERNAME, then the password database
    except (OSError, KeyError):
        return f"uid {os.getuid()}"


def _reason(args: argparse.Namespace, question: str) -> str:
    """``--reason``, or asked on a terminal; a ConfigError (exit 2) otherwise."""
    if args.reason and args.reason.strip():
        return str(args.reason).strip()
    if sys.stdin.isatty():
        try:
            answer = input(question).strip()
        except EOFError:
            answer = ""
        if answer:
            return answer
    raise ConfigError(f"{args.command} needs a reason (--reason TEXT, or answer the prompt)")


def hold_source_lock(source: Source, work: Callable[[], T]) -> T:
    """``work()`` (a command's change to the frontier) while holding ``source:<name>``.

    A ``collect`` run in progress counts the source's dead pages in its account; a command that
    turns them back into queued or done pages under it would make its ledger fail. So the
    command waits for the run like another run would (``locks.wait_s``), then raises SourceBusy
    before ``work`` starts. The lock lives on the Prefect server the runs use.
    """
    if not source.locks.source_lock:
        return work()
    _prefect_environment()
    _prefect_server()
    from flows._locks import call_under_source_lock

    return call_under_source_lock(source, work)


def under_source_lock(source: Source, what: str, work: Callable[[], int]) -> int:
    """:func:`hold_source_lock` for a command's exit code: busy is exit 3 and one line."""
    from collector.run.locks import SourceBusy
    from collector.run.stop import StoppedWaiting

    try:
        return hold_source_lock(source, work)
    except (SourceBusy, StoppedWaiting) as exc:
        print(f"collector: busy: {exc}; {what} changed nothing", file=sys.stderr)
        return EXIT_BUSY


def cmd_triage(args: argparse.Namespace) -> int:
    _prefect_environment()
    load(args.source)  # an invalid source: exit 2 before Prefect starts (main)
    _prefect_server()
    from collector.run.locks import SourceBusy
    from flows._locks import quiet_console_for_the_command
    from flows.triage import run_triage

    quiet_console_for_the_command()  # a busy lock: said in one line below
    try:
        from flows.sources import source_reference

        report = run_triage(source_reference(args.source), limit=args.limit, dry_run=args.dry_run)
    except SourceBusy as exc:
        print(f"collector: busy: {exc}; triage changed nothing", file=sys.stderr)
        return EXIT_BUSY
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, default=str))
    else:
        _print_triage(report, args.source, dry_run=args.dry_run)
    if report.get("interrupted"):
        from collector.run.stop import EXIT_CODES

        print(f"collector: triage interrupted by {report['interrupted']}: the entries it had"
              " claimed are settled, the rest stay open for the next triage",
              file=sys.stderr)  # fmt: skip
        return EXIT_CODES.get(report["interrupted"], EXIT_FAILED)
    if not report["balance"]["balanced"]:
        print(f"collector: dead letters do not balance: {report['balance']['difference']}",
              file=sys.stderr)  # fmt: skip
    return EXIT_OK if report["balance"]["balanced"] else EXIT_FAILED


def _print_triage(report: dict[str, Any], reference: str, *, dry_run: bool) -> None:
    """What triage did (or, in a dry run, would do), then the store's balance as it stands."""
    names = ("repaired", "reenqueued", "escalated", "discarded", "open", "skipped")
    counts = ", ".join(f"{name} {report[name]}" for name in names)
    if dry_run:
        print(f"triage of {report['source']} (dry run, nothing changed): of {report['seen']}"
              f" entries seen, would have {counts}")  # fmt: skip
    else:
        print(f"triage of {report['source']}: of {report['seen']} entries seen, {counts}")
    balance = report["balance"]
    print(
        ("balance of the store, unchanged by the dry run: " if dry_run else "balance: ")
        + f"quarantined {balance['quarantined']} = repaired {balance['repaired']}"
        f" + re-enqueued {balance['reenqueued']} + escalated {balance['escalated']}"
        f" + discarded {balance['discarded']} + open {balance['open']}"
        + (f" + other {balance['other']}" if balance["other"] else "")
    )
    if not dry_run and report["escalated"]:
        print(f"next: the escalated entries wait for a person: collector review {reference}")


def cmd_batches(args: argparse.Namespace) -> int:
    """The batches written to the sink: id, run, records, when written (what compensate and
    audit name)."""
    from collector.backends import open_sink

    source = load(args.source, look_only=True)
    sink = open_sink(source, readonly=True)  # only looks: works beside a run
    try:
        rows = sorted((_batch_row(s) for s in sink.batch_summaries()), key=_batch_order)
        where = sink.location()
    finally:
        sink.close()
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK
    if not rows:
        print(f"no batches in {where}", file=sys.stderr)
        return EXIT_OK
    header = ("BATCH", "RUN", "TOKEN", "RECORDS", "WRITTEN (UTC)")
    table = [header, *[(r["batch_id"], r["run"], r["token"], str(r["records"]),
                        r["written_at"] or "-") for r in rows]]  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(line.rstrip())
    print(f"{counted(len(rows), 'batch')} in {where}", file=sys.stderr)
    return EXIT_OK


def _batch_order(row: dict[str, Any]) -> tuple[float, str, int, str]:
    """Oldest first, and a run's batches by token as a number (``:2`` before ``:10``)."""
    token = row["token"]
    number = int(token) if token.isdigit() else -1
    return (row["written"] if row["written"] is not None else 0.0, row["run"], number, token)


def _batch_row(summary: BatchSummary) -> dict[str, Any]:
    """One batch for the table and ``--json``: ``written`` stays an epoch float for scripts
    (``None`` when the sink has no time for it), ``written_at`` is the readable UTC form."""
    run, _, token = summary.batch_id.rpartition(":")
    written = summary.written_at
    return {
        "batch_id": summary.batch_id, "run": run, "token": token, "records": summary.records,
        "written": written, "written_at": None if written is None else when(written),
    }  # fmt: skip


def cmd_compensate(args: argparse.Namespace) -> int:
    """Exit 0 when the batch was compensated (or would be, with --dry-run); 1 when it is not in
    the sink, was compensated already, or the flow failed; 2 without a reason, for a
    replacement that names no record of the batch, or for an ambiguous abbreviated id."""
    source = load(args.source)
    replacements = _replacements(args.replace) if args.replace else []
    found, args.batch = _compensation_target(  # from here on, the full id
        source, args.source, args.batch, replacements, dry_run=args.dry_run
    )
    if found is not None:
        return found
    reason = _reason(args, "Reason for compensating (kept in the ledger): ")
    _prefect_environment()
    _prefect_server()
    from flows._locks import quiet_console_for_the_command
    from flows.recovery import run_compensate

    quiet_console_for_the_command()
    try:
        from flows.sources import source_reference

        report = run_compensate(
            source_reference(args.source),  # the run's parameter: absolute, as the UI shows it
            batch=args.batch,
            reason=reason,
            by=operator_name(),
            replacements=replacements,
        )
    except ConfigError:
        raise  # a replacement without a key of the batch, a suite GX rejects: exit 2 (main)
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, default=str))
        return EXIT_OK
    if report["status"] == "already":
        print(f"batch {args.batch} was already compensated: {report['earlier']}", file=sys.stderr)
        return EXIT_FAILED
    print(f"compensated batch {args.batch}: {report['removed']} records removed from"
          f" {report['sink']} (recorded in {report['ledger']})")  # fmt: skip
    _print_replacements(report, args.source, dry_run=False)
    return EXIT_OK


def _compensation_target(
    source: Source, reference: str, batch: str, replacements: list[Any], *, dry_run: bool
) -> tuple[int | None, str]:
    """The checks that need no flow: an exit code when there is nothing to do (compensated
    already, not in the sink) or on a dry run (what it would do), None to go on; and the full
    id ``batch`` abbreviates (collector.recovery.batch_ids), resolved before anything else."""
    from collector.backends import open_backends
    from collector.recovery.compensation import compensate_batch, done_before, replacement_batch
    from collector.run.ledger import LedgerBook

    book = LedgerBook(source.ledger_path)
    with open_backends(source, readonly_sink=True) as stores:
        where = stores.sink.location()
        held = stores.sink.batches()
        batch = _resolved(batch, held, book, source, where)
        already = done_before(book, source.name, batch, holds=batch in held)
        if already is not None:
            print(f"batch {batch} was already compensated ({already.removed} records removed:"
                  f" {already.reason})", file=sys.stderr)  # fmt: skip
            return EXIT_FAILED, batch
        if batch not in held and replacement_batch(batch) not in held:
            print(f"batch {batch}: not in {where} (never written, or every record since"
                  f" overwritten); list them with: collector batches {reference}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_FAILED, batch
        validator = None  # the keys are checked below in any case (exit 2 before Prefect)
        if dry_run and replacements and source.suite_path is not None:
            from collector.settle.validation import SuiteValidator

            validator = SuiteValidator(source.suite_path)
        report = compensate_batch(
            source, sink=stores.sink, book=book, deadletters=stores.deadletters,
            frontier=stores.frontier, validator=validator, batch_id=batch, reason="(dry run)",
            by="", run_id="", replacements=replacements, dry_run=True,
        )  # fmt: skip
    if not dry_run:
        return None, batch
    print(f"dry run: compensating batch {batch} would remove {report.removed} records"
          f" from {where}; nothing changed")  # fmt: skip
    _print_replacements(report.as_dict(), str(source.name), dry_run=True)
    return EXIT_OK, batch


def _resolved(batch: str, held: list[str], book: Any, source: Source, where: str) -> str:
    from collector.recovery.batch_ids import resolve_written_batch

    return resolve_written_batch(batch, held, book, source.name, where=where)


def _audit_targets(source: Source, batches: list[str]) -> list[str]:
    """The full ids of the batches ``audit --batch`` names (an ambiguous one: exit 2 before
    Prefect starts), read from the sink without taking its writer's lock."""
    if not batches:
        return batches
    from collector.backends import open_sink
    from collector.run.ledger import LedgerBook

    sink = open_sink(source, readonly=True)
    try:
        held, where = sink.batches(), sink.location()
    finally:
        sink.close()
    book = LedgerBook(source.ledger_path)
    return [_resolved(batch, held, book, source, where) for batch in batches]


def _print_replacements(report: dict[str, Any], reference: str, *, dry_run: bool) -> None:
    """What became of the replacement records (nothing when none were given)."""
    kept = len(report["written"]) + len(report["unchanged"])
    review = report["review"]
    if not (kept or review or report["superseded"]):
        return
    verb, went = ("would write", "would go") if dry_run else ("wrote", "sent")
    print(f"replacements: {verb} {kept} to batch {report['replacement_batch']}"
          + (f" ({len(report['unchanged'])} stored already)" if report["unchanged"] else "")
          + (f", {len(report['superseded'])} superseded by newer writes"
             if report["superseded"] else "")
          + f"; {len(review)} failing the suite {went} to review")  # fmt: skip
    for refused in review:
        print(f"  {refused['key']}: {refused['message']}")
    if review and not dry_run:
        print(f"they wait for a person: collector review {reference}")


def _replacements(path: str) -> list[Any]:
    """Replacement records from a file: a JSON array, one JSON object, or JSON lines."""
    try:
        text = (sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")).strip()
    except OSError as exc:
        raise ConfigError(f"--replace {path}: {exc.strerror or exc}") from None
    try:
        loaded = json.loads(text) if text else []
    except json.JSONDecodeError:
        try:
            loaded = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--replace {path}: not JSON: {exc}") from None
    return loaded if isinstance(loaded, list) else [loaded]


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 when every audited batch passes or was compensated; 1 when a dry run found
    failing batches or a named batch is not in the sink; 2 for a source without a suite."""
    from collector.run.ledger import LedgerBook

    source = load(args.source)
    if source.suite_path is None:
        raise ConfigError(f"{args.source}: validation.suite: the source has no suite to audit with")
    args.batch = _audit_targets(source, args.batch)
    _prefect_environment()
    _prefect_server()
    from flows._locks import quiet_console_for_the_command
    from flows.recovery import run_audit

    quiet_console_for_the_command()
    try:
        from flows.sources import source_reference

        report = run_audit(
            source_reference(args.source),
            batches=args.batch,
            dry_run=args.dry_run,
            by=f"audit:{operator_name()}",
        )
    except ConfigError:
        raise  # a suite GX rejects, a missing variable: one line, exit 2 (main)
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    book = LedgerBook(source.ledger_path)
    audited = {b["batch_id"] for b in report["batches"]}
    missing = [b for b in args.batch if b not in audited]
    for batch_id in missing:
        done = book.compensated(source.name, batch_id)
        note = f"already compensated: {done.reason}" if done else "never written, or overwritten"
        print(f"batch {batch_id}: not in {report['sink']} ({note})", file=sys.stderr)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        _print_audit(report, dry_run=args.dry_run)
    return EXIT_FAILED if missing or (args.dry_run and report["failed"]) else EXIT_OK


def _print_audit(report: dict[str, Any], *, dry_run: bool) -> None:
    """Table-level failures (compensated) and row-level failures (reported only), counted the
    way ``--json`` counts them."""
    verb = "would compensate" if dry_run else "compensated"
    batches = report["batches"]
    failed = [b for b in batches if b["failed"]]
    for batch in failed:
        names = ", ".join(f["expectation"] for f in batch["failed"])
        removed = "" if batch["removed"] is None else f": {counted(batch['removed'], 'record')}"
        records = counted(batch["records"], "record")
        print(f"batch {batch['batch_id']} ({records}) fails {names}: {verb}"
              f"{removed and removed + ' removed'}")  # fmt: skip
    rows = [b for b in batches if b["rows_failing"]]
    for batch in rows:
        print(f"batch {batch['batch_id']} ({counted(batch['records'], 'record')}):"
              f" {batch['rows_failing']} records fail row-level expectations"
              " (reported only; triage handles records)")  # fmt: skip
    failing_rows = sum(b["rows_failing"] for b in batches)
    recorded = f" (recorded in {report['ledger']})" if report["compensated"] and not dry_run else ""
    checked = counted(len(batches), "batch")
    print(f"audit of {report['source']}: {checked} checked in {report['sink']},"
          f" {len(failed)} failing table-level expectations, {report['compensated']}"
          f" compensated{recorded}; {counted(failing_rows, 'record')} in"
          f" {counted(len(rows), 'batch')} failing row-level expectations")  # fmt: skip


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    triage = commands.add_parser("triage", help="run the triage flow over open dead letters")
    add_source(triage)
    triage.add_argument(
        "--limit", type=positive_int, default=defaults.TRIAGE_LIMIT, metavar="N",
        help=f"at most N entries per run (default {defaults.TRIAGE_LIMIT})",
    )  # fmt: skip
    triage.add_argument("--dry-run", action="store_true", help="decide and report only")
    add_json(triage, "the report")
    triage.set_defaults(func=cmd_triage)

    batches = commands.add_parser(
        "batches", help="list the batches written to the sink (ids for compensate and audit)"
    )
    add_source(batches)
    add_json(batches, "the batches")
    batches.set_defaults(func=cmd_batches)

    comp = commands.add_parser("compensate", help="undo exactly one batch's writes in the sink")
    add_source(comp)
    comp.add_argument("--batch", required=True, metavar="ID",
                      help="batch id (run:token; see collector batches SOURCE), or a unique"
                      " prefix of it (f26a7169-4d1e, or f26a7169:67: the run's, with the"
                      " token)")  # fmt: skip
    comp.add_argument("--reason", default=None,
                      help="why, kept in the ledger (asked for on a terminal)")  # fmt: skip
    comp.add_argument(
        "--replace", default=None, metavar="FILE",
        help="corrected records for keys of the batch (JSON array, object or lines; - for"
        " stdin): written if they pass the source's suite, sent to review if not",
    )  # fmt: skip
    comp.add_argument("--dry-run", action="store_true",
                      help="say what would be removed and written; change nothing")  # fmt: skip
    add_json(comp, "the report")
    comp.set_defaults(func=cmd_compensate)

    check = commands.add_parser(
        "audit", help="check written batches with the current suite; compensate failing ones"
    )
    add_source(check)
    check.add_argument(
        "--batch", action="append", default=[], metavar="ID",
        help="audit only this batch (repeatable; a unique prefix, as compensate's --batch);"
        " default: every batch in the sink",
    )  # fmt: skip
    check.add_argument("--dry-run", action="store_true", help="report only, remove nothing")
    add_json(check, "the report")
    check.set_defaults(func=cmd_audit)
