"""``collector triage``, ``compensate`` and ``audit``: mending what was stored or failed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from collector import defaults
from collector.errors import CollectorError, ConfigError
from flows.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    _prefect_environment,
    _prefect_server,
)


def cmd_triage(args: argparse.Namespace) -> int:
    _prefect_environment()
    _prefect_server()
    from collector.config import SourceError, load_source

    try:
        load_source(args.source)
    except SourceError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_INVALID
    from flows.triage import run_triage

    try:
        report = run_triage(args.source, limit=args.limit, dry_run=args.dry_run)
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, default=str))
    else:
        names = ("seen", "repaired", "reenqueued", "escalated", "discarded", "open", "skipped")
        counts = ", ".join(f"{name} {report[name]}" for name in names)
        print(f"triage of {report['source']}: {counts}")
        balance = report["balance"]
        print(
            f"balance: quarantined {balance['quarantined']} = repaired {balance['repaired']}"
            f" + re-enqueued {balance['reenqueued']} + escalated {balance['escalated']}"
            f" + discarded {balance['discarded']} + open {balance['open']}"
            + (f" + other {balance['other']}" if balance["other"] else "")
        )
    if not report["balance"]["balanced"]:
        print(f"collector: dead letters do not balance: {report['balance']['difference']}",
              file=sys.stderr)  # fmt: skip
    return EXIT_OK if report["balance"]["balanced"] else EXIT_FAILED


def cmd_compensate(args: argparse.Namespace) -> int:
    from collector.backends import open_frontier, open_sink
    from collector.config import load_source
    from collector.run.ledger import LedgerBook, compensate

    source = load_source(args.source)
    book = LedgerBook(source.ledger_path)
    already = book.compensated(source.name, args.batch)
    if already is not None:
        print(f"batch {args.batch} was already compensated ({already.removed} records removed:"
              f" {already.reason})", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    frontier = open_frontier(source)
    try:
        sink = open_sink(source)
        where = sink.location()
        try:
            done = compensate(
                sink,
                book,
                source=source.name,
                batch_id=args.batch,
                reason=args.reason,
                by=os.environ.get("USER", ""),
                frontier=frontier,  # the pages are fetched again by the next run
            )
        finally:
            sink.close()
    finally:
        frontier.close()
    print(f"compensated batch {args.batch}: {done.removed} records removed from {where}"
          f" (recorded in {source.ledger_path})")  # fmt: skip
    return EXIT_OK if done.removed else EXIT_FAILED


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 when every audited batch passes or was compensated; 1 when a dry run found
    failing batches or a named batch is not in the sink; 2 for a source without a suite."""
    from collector.backends import open_frontier, open_sink
    from collector.config import SourceError, load_source
    from collector.recovery.audit import audit
    from collector.run.ledger import LedgerBook

    try:
        source = load_source(args.source)
    except SourceError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_INVALID
    if source.suite_path is None:
        print(f"{args.source}: validation.suite: the source has no suite to audit with",
              file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    from collector.settle.validation import SuiteValidator

    validator = SuiteValidator(source.suite_path)
    book = LedgerBook(source.ledger_path)
    try:
        frontier = open_frontier(source)
        try:
            sink = open_sink(source)
            try:
                where = sink.location()
                report = audit(
                    sink,
                    validator,
                    book,
                    source=source.name,
                    batch_ids=args.batch or None,
                    dry_run=args.dry_run,
                    by=f"audit:{os.environ.get('USER', '')}",
                    frontier=frontier,
                )
            finally:
                sink.close()
        finally:
            frontier.close()
    except ConfigError:
        raise  # a suite GX rejects, a missing variable: one line, exit 2 (main)
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    audited = {b.batch_id for b in report.batches}
    missing = [b for b in args.batch if b not in audited]
    for batch_id in missing:
        done = book.compensated(source.name, batch_id)
        note = f"already compensated: {done.reason}" if done else "never written, or overwritten"
        print(f"batch {batch_id}: not in {where} ({note})", file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        verb = "would compensate" if args.dry_run else "compensated"
        for batch in report.failed:
            names = ", ".join(f["expectation"] for f in batch.failed)
            removed = "" if batch.removed is None else f": {batch.removed} records removed"
            print(f"batch {batch.batch_id} ({batch.records} records) fails {names}: {verb}"
                  f"{removed}")  # fmt: skip
        print(f"audit of {source.name}: {len(report.batches)} batches checked in {where},"
              f" {len(report.failed)} failing, {len(report.compensated)} compensated"
              + ("" if args.dry_run else f" (recorded in {source.ledger_path})"))  # fmt: skip
    return EXIT_FAILED if missing or (args.dry_run and report.failed) else EXIT_OK


def register(commands: Any) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    triage = commands.add_parser("triage", help="run the triage flow over open dead letters")
    triage.add_argument("source", metavar="SOURCE")
    triage.add_argument("--limit", type=int, default=defaults.TRIAGE_LIMIT, metavar="N")
    triage.add_argument("--dry-run", action="store_true", help="decide and report only")
    triage.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    triage.set_defaults(func=cmd_triage)

    comp = commands.add_parser("compensate", help="undo exactly one batch's writes in the sink")
    comp.add_argument("source", metavar="SOURCE")
    comp.add_argument("--batch", required=True, metavar="ID", help="batch id (run:token)")
    comp.add_argument("--reason", default="operator request", help="kept in the ledger")
    comp.set_defaults(func=cmd_compensate)

    check = commands.add_parser(
        "audit", help="check written batches with the current suite; compensate failing ones"
    )
    check.add_argument("source", metavar="SOURCE")
    check.add_argument(
        "--batch", action="append", default=[], metavar="ID",
        help="audit only this batch (repeatable); default: every batch in the sink",
    )  # fmt: skip
    check.add_argument("--dry-run", action="store_true", help="report only, remove nothing")
    check.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    check.set_defaults(func=cmd_audit)
