"""The ``collector`` command.

``collector schema``                 print the JSON schema of a source file
``collector validate SOURCE...``     check sources without running them (exit 2 when invalid)
``collector run SOURCE``             run the collect flow as a Prefect flow run
``collector work SOURCE``            help drain a running source's shared frontier (no plan)
``collector demo``                   start the local demo site and collect it
``collector deadletters list|show``  look at what failed and why
``collector deadletters retry|discard``  fetch again, or resolve with a reason that is kept
``collector triage SOURCE``          run the triage flow (repair, replay, re-enqueue, escalate)
``collector compensate SOURCE --batch ID``  undo exactly one batch's writes (recorded)
``collector blocks register``        register Collector's Prefect block types (UI-editable)
``collector blocks save NAME FILE``  store a source file as a ``CollectorSource`` block
``collector audit SOURCE``           check written batches against the current suite's table-level
                                     expectations; compensate each batch that fails

Prefect is imported only by the commands that run flows, so ``validate`` and ``schema`` answer
at once. Exit codes: 0 ok (or skipped: the source was busy and ``on_busy`` is skip), 1 the run
did not balance or failed, 2 invalid input, 3 the source was busy: another run held its lock
for the whole wait.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector import defaults
from collector.errors import CollectorError, ConfigError

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BUSY = 0, 1, 2, 3

# Quiet, offline defaults for the embedded Prefect server; the user's own settings win.
_PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
    "PREFECT_LOGGING_SERVER_LEVEL": "ERROR",
    "PREFECT_UI_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",  # the client-side telemetry notice and calls (offline by design)
}


def _prefect_environment() -> None:
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def _console(stderr: bool = True) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


# --- schema / validate --------------------------------------------------------------------------
def cmd_schema(args: argparse.Namespace) -> int:
    from collector.config import source_json_schema

    print(json.dumps(source_json_schema(), indent=2))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from collector.config import SourceError, load_source

    status = EXIT_OK
    for path in args.sources:
        try:
            source = load_source(path)
        except SourceError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            status = EXIT_INVALID
            continue
        urls = sum(1 for _ in source.iter_seed_urls())
        print(f"{path}: ok ({source.name}: {urls} seed URLs, sink {source.sink_label})")
    return status


# --- run ----------------------------------------------------------------------------------------
class _Progress:
    """A rich progress bar fed by the flow's progress listeners."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if event == "planned":
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]collect"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=_console(),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "collect", total=max(data["to_fetch"], 1), detail=""
            )
        elif event == "batch" and self._progress is not None:
            ledger = data["ledger"]
            self._progress.update(
                self._task,
                completed=ledger.stored
                + ledger.dead_lettered
                - ledger.already_dead
                - ledger.refused_at_plan,
                detail=f"stored {ledger.stored}  dead {ledger.dead_lettered}  "
                f"deferred {ledger.retried}",
            )
        elif event == "waiting" and self._progress is not None:
            self._progress.update(self._task, detail=f"waiting {data['seconds']:.1f}s for retries")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _run(source: str, args: argparse.Namespace) -> tuple[int, dict[str, Any] | None]:
    """Run the collect flow; returns (exit code, summary or None)."""
    _prefect_environment()
    from collector.config import SourceError, load_source

    try:
        loaded = load_source(source)
    except SourceError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_INVALID, None
    from collector.backends import open_deadletters, open_frontier, open_sink

    try:  # reach the stores before Prefect starts: one line if one is down, not a traceback
        frontier = open_frontier(loaded)
        try:
            open_deadletters(loaded).close()
            open_sink(loaded).close()
        finally:
            frontier.close()
    except ConfigError as exc:  # a missing variable or Secret / RedisDatabase block
        print(f"{source}: {exc}", file=sys.stderr)
        return EXIT_INVALID, None
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED, None
    from collector.observability import init_sentry, register_secrets

    init_sentry()  # only when SENTRY_DSN is set; fast options (see collector.observability)
    register_secrets(loaded.secret_values())  # scrubbed from Sentry events and every log line
    if loaded.suite_path is not None:
        from collector.validation_worker import prewarm

        prewarm(loaded.suite_path)  # GX imports on the other core while Prefect starts
    from collector.locks import SourceBusy
    from flows.collect import progress_listeners, run_collect

    progress = _Progress(enabled=not args.json and sys.stderr.isatty())
    progress_listeners.append(progress)
    try:
        summary = run_collect(
            source,
            batch_size=args.batch_size,
            max_items=args.max_items,
            drain_wait_s=args.drain_wait,
            role=getattr(args, "role", "run"),
            on_busy=getattr(args, "on_busy", None),
            lock_wait_s=getattr(args, "lock_wait", None),
            idle_wait_s=getattr(args, "idle_wait", 0.0),
        )
    except SourceBusy as exc:
        progress.stop()
        print(f"collector: busy: {exc}", file=sys.stderr)
        return EXIT_BUSY, None
    except ConfigError as exc:
        progress.stop()
        print(f"{source}: {exc}", file=sys.stderr)
        return EXIT_INVALID, None
    except CollectorError as exc:
        progress.stop()
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED, None
    finally:
        progress.stop()
        progress_listeners.remove(progress)
    if summary.get("skipped"):
        return EXIT_OK, summary
    return (EXIT_OK if summary["balanced"] else EXIT_FAILED), summary


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    console = _console(stderr=False)
    if summary.get("skipped"):
        console.print(f"skipped: another run of {summary['source']} holds its source lock")
        return
    if summary.get("role") == "work":
        verdict = "[green]balanced" if summary["balanced"] else "[red]NOT balanced"
        console.print(
            f"worker of {summary['source']}: claimed {summary['claimed']} = stored "
            f"{summary['stored']} + dead {summary['dead_lettered']} + returned "
            f"{summary['returned']} + stale {summary['stale_acks']} + released "
            f"{summary['released']}: {verdict}"
        )
        for problem in summary["problems"]:
            console.print(f"[red]  {problem}")
        return
    table = Table(title=f"Ledger of {summary['source']}", show_header=True)
    table.add_column("terminal state")
    table.add_column("items", justify="right")
    for name in ("stored", "fresh_skipped", "expired", "dead_lettered", "queued"):
        table.add_row(name, str(summary[name]))
    table.add_row("[bold]discovered", f"[bold]{summary['discovered']}")
    console.print(table)
    verdict = "[green]balanced" if summary["balanced"] else "[red]NOT balanced"
    console.print(
        f"conservation: {verdict}   records written {summary['records_written']}, "
        f"unchanged {summary['records_unchanged']}, quarantined "
        f"{summary['records_quarantined']}   {summary['pages_per_second']} pages/s   "
        f"{summary['requests']} requests, {summary['retries']} retries"
    )
    if summary.get("stale_writes"):
        console.print(
            f"fencing:      {summary['stale_writes']} record writes refused (a newer lease "
            "holder had written them)"
        )
    for problem in summary["problems"]:
        console.print(f"[red]  {problem}")
    console.print(f"records:      {summary['sink']}")
    console.print(
        f"dead letters: {summary['deadletters']} (archive {summary['deadletter_archive']})"
    )


def cmd_run(args: argparse.Namespace) -> int:
    code, summary = _run(args.source, args)
    if summary is not None:
        if args.json:
            print(json.dumps(summary, default=str))
        else:
            _print_summary(summary)
    return code


# --- demo ---------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from collector.demo.scenario import FAULT_PATHS, write_demo_source
    from collector.demo.site import FaultSite

    folder = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="collector-demo-"))
    )
    console = _console(stderr=False)
    with FaultSite() as site:
        source = write_demo_source(folder, site.base_url)
        if not args.json:
            console.print(f"[bold]Collector demo[/]: demo site at {site.base_url}, source {source}")
            console.print("Deliberate faults in the seeds:")
            for path, expected in FAULT_PATHS.items():
                console.print(f"  {path:48} -> {expected}")
        code, summary = _run(str(source), args)
        if summary is None:
            return code
        summary["demo_site_requests"] = site.request_count()
    if args.json:
        print(json.dumps(summary, default=str))
        return code
    _print_summary(summary)
    _show_records(Path(summary["sink"]), console)
    _show_dead_letters(source, console)
    return code


def _show_records(folder: Path, console: Any, limit: int = 3) -> None:
    console.print("\n[bold]A few stored records[/]")
    shown = 0
    for file in sorted(folder.glob("*.jsonl")):
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                console.print("  " + line.strip()[:160])
                shown += 1
                if shown >= limit:
                    return


def _show_dead_letters(source_path: Path, console: Any) -> None:
    from collector.config import load_source
    from collector.deadletter import SqliteDeadLetterStore

    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        entries = store.list(source=source.name, limit=50)
    finally:
        store.close()
    console.print(f"\n[bold]Dead letters ({len(entries)} open)[/]")
    for entry in entries:
        console.print(
            f"  {entry.stage:8} {entry.error_class:30} {entry.url}\n"
            f"           {entry.message[:120]} (attempts {entry.attempts})"
        )


# --- dead letters -------------------------------------------------------------------------------
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d``, ``1w`` -> seconds (argparse type)."""
    match = _AGE.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 90s, 15m, 2h, 3d or 1w")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def _store_for(source_path: str) -> tuple[Any, Any]:
    """The source and its dead-letter store (whichever backend the source names)."""
    from collector.backends import open_deadletters
    from collector.config import load_source

    source = load_source(source_path)
    return source, open_deadletters(source)


def _selected(source: Any, store: Any, args: argparse.Namespace) -> list[Any]:
    """The entries named by id, or those matching the filters (at least one is required)."""
    if args.ids:
        entries = []
        for entry_id in args.ids:
            entry = store.get(entry_id)
            if entry is None or entry.source != source.name:
                raise ConfigError(f"no dead letter with id {entry_id!r} in {source.name}")
            entries.append(entry)
        return entries
    if not (args.stage or args.error_class or args.older_than is not None or args.all):
        raise ConfigError("name entries by id, or select them with --stage, --error-class,"
                          " --older-than or --all")  # fmt: skip
    return list(
        store.list(
            source=source.name,
            stage=args.stage,
            error_class=args.error_class,
            status="open",
            limit=args.limit,
            first_seen_before=None if args.older_than is None else time.time() - args.older_than,
        )
    )


def _discard_reason(args: argparse.Namespace) -> str | None:
    if args.reason:
        return str(args.reason).strip() or None
    if not sys.stdin.isatty():
        return None
    try:
        return input("Reason for discarding (kept with each entry): ").strip() or None
    except EOFError:
        return None


def cmd_deadletters(args: argparse.Namespace) -> int:
    source, store = _store_for(args.source)
    try:
        if args.action == "list":
            entries = store.list(
                source=source.name,
                stage=args.stage,
                error_class=args.error_class,
                status=None if args.status == "all" else args.status,
                limit=args.limit,
                first_seen_before=None
                if args.older_than is None
                else time.time() - args.older_than,
            )
            if args.json:
                print(json.dumps([e.to_dict() for e in entries], default=str))
            for entry in [] if args.json else entries:
                where = f"{entry.stage:8} {entry.error_class:28}"
                print(f"{entry.id}  {entry.status:8} {where} {entry.url}")
            return EXIT_OK
        if args.action == "show":
            entry = store.get(args.id)
            if entry is None:
                print(f"no dead letter with id {args.id!r}", file=sys.stderr)
                return EXIT_INVALID
            print(json.dumps(entry.to_dict(), indent=2, default=str))
            return EXIT_OK
        if args.action == "discard":
            return _discard(source, store, args)
        return _retry(source, store, args)
    finally:
        store.close()


# --- blocks -------------------------------------------------------------------------------------
def cmd_blocks(args: argparse.Namespace) -> int:
    """Register block types, or save a source file as a block, on the current Prefect API."""
    _prefect_environment()
    from collector.config import SourceError, load_source

    if args.action == "save":
        try:
            load_source(args.file)  # the block must hold a valid source
        except SourceError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            return EXIT_INVALID
    from blocks import register_block_types
    from blocks.source import CollectorSource

    slugs = register_block_types()
    if args.action == "register":
        print("registered block types: " + ", ".join(slugs))
        return EXIT_OK
    block = CollectorSource.from_file(args.file)
    block.save(args.name, overwrite=True, _sync=True)  # type: ignore[call-arg]
    print(f"saved collector-source/{args.name}: run it with source=block:{args.name}")
    return EXIT_OK


def _discard(source: Any, store: Any, args: argparse.Namespace) -> int:
    from collector.triage import resolution

    entries = _selected(source, store, args)
    reason = _discard_reason(args)
    if reason is None:
        print("collector: discard needs a reason (--reason TEXT, or answer the prompt)",
              file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    done = sum(store.resolve(e.id, resolution("discarded", reason)) for e in entries)
    print(f"discarded {done} of {len(entries)} dead letters ({len(entries) - done} were not open)")
    return EXIT_OK


def _retry(source: Any, store: Any, args: argparse.Namespace) -> int:
    """Fetch the entries' URLs again: back to the frontier's queue, entries resolved once."""
    from collector.backends import open_frontier
    from collector.triage import resolution

    entries = _selected(source, store, args)
    frontier = open_frontier(source)
    requeued = refused = 0
    try:
        for entry in entries:
            if entry.status == "resolved":
                continue
            if not frontier.requeue(
                source.name, [entry.url], now=time.time(), queue_ttl_s=source.ttl.queue_ttl_s
            ):
                refused += 1
                print(f"{entry.id}: the frontier does not hold {entry.url} as dead or expired;"
                      " not re-enqueued", file=sys.stderr)  # fmt: skip
                continue
            if store.resolve(entry.id, resolution("reenqueued", "operator retry"), requeued=True):
                requeued += 1
    finally:
        frontier.close()
    print(f"re-enqueued {requeued} of {len(entries)} dead letters; the next run fetches them")
    return EXIT_OK if not refused else EXIT_FAILED


# --- triage and compensation --------------------------------------------------------------------
def cmd_triage(args: argparse.Namespace) -> int:
    _prefect_environment()
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
    return EXIT_OK if report["balance"]["balanced"] else EXIT_FAILED


def cmd_compensate(args: argparse.Namespace) -> int:
    from collector.backends import open_frontier, open_sink
    from collector.config import load_source
    from collector.ledger import LedgerBook, compensate

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
    from collector.audit import audit
    from collector.backends import open_frontier, open_sink
    from collector.config import SourceError, load_source
    from collector.ledger import LedgerBook

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
    from collector.validation import SuiteValidator

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


# --- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collector", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("schema", help="print the JSON schema of a source file").set_defaults(
        func=cmd_schema
    )

    validate = commands.add_parser("validate", help="check source files without running them")
    validate.add_argument("sources", nargs="+", metavar="SOURCE")
    validate.set_defaults(func=cmd_validate)

    def run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, metavar="N")
        p.add_argument("--max-items", type=int, default=None, metavar="N")
        p.add_argument(
            "--drain-wait", type=float, default=defaults.DRAIN_WAIT_S, metavar="SECONDS",
            help="how long to wait for retry-later items and others' leases",
        )  # fmt: skip
        p.add_argument("--json", action="store_true", help="one JSON summary on stdout's last line")

    run = commands.add_parser("run", help="run the collect flow for a source")
    run.add_argument("source", metavar="SOURCE")
    run_options(run)
    run.add_argument(
        "--on-busy", choices=["wait", "skip"], default=None,
        help="when another run holds the source lock (default: the source's locks.on_busy)",
    )  # fmt: skip
    run.add_argument(
        "--lock-wait", type=float, default=None, metavar="SECONDS",
        help="how long 'wait' waits for the source lock, then exit 3 (default: locks.wait_s)",
    )  # fmt: skip
    run.set_defaults(func=cmd_run, role="run")

    work = commands.add_parser(
        "work", help="help drain a source's shared frontier (no plan, no source lock)"
    )
    work.add_argument("source", metavar="SOURCE")
    run_options(work)
    work.add_argument(
        "--idle-wait", type=float, default=defaults.WORK_IDLE_WAIT_S, metavar="SECONDS",
        help="how long to wait for items to appear when the frontier has none",
    )  # fmt: skip
    work.set_defaults(func=cmd_run, role="work")

    demo = commands.add_parser("demo", help="collect the bundled local demo site")
    demo.add_argument("--workdir", default=None, help="folder for the demo (default: a temp dir)")
    run_options(demo)
    demo.set_defaults(func=cmd_demo)

    letters = commands.add_parser("deadletters", help="inspect dead letters")
    letter_actions = letters.add_subparsers(dest="action", required=True)
    listing = letter_actions.add_parser("list")
    listing.add_argument("source", metavar="SOURCE")
    listing.add_argument("--stage", default=None)
    listing.add_argument("--error-class", default=None)
    listing.add_argument("--status", default="open", choices=["open", "review", "resolved", "all"])
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    listing.add_argument(
        "--older-than", type=parse_age, default=None, metavar="AGE",
        help="first seen longer ago than AGE (90s, 15m, 2h, 3d, 1w)",
    )  # fmt: skip
    show = letter_actions.add_parser("show")
    show.add_argument("source", metavar="SOURCE")
    show.add_argument("id")
    for name, helptext in (
        ("retry", "fetch the entries' URLs again (back to the frontier's queue)"),
        ("discard", "resolve entries as discarded, with a reason that is kept"),
    ):
        act = letter_actions.add_parser(name, help=helptext)
        act.add_argument("source", metavar="SOURCE")
        act.add_argument("ids", nargs="*", metavar="ID")
        act.add_argument("--stage", default=None)
        act.add_argument("--error-class", default=None)
        act.add_argument("--older-than", type=parse_age, default=None, metavar="AGE")
        act.add_argument("--all", action="store_true", help="every open entry of the source")
        act.add_argument("--limit", type=int, default=10_000)
        if name == "discard":
            act.add_argument("--reason", default=None, help="required when not interactive")
    letters.set_defaults(func=cmd_deadletters)

    blocks = commands.add_parser("blocks", help="Prefect block types for sources and backends")
    block_actions = blocks.add_subparsers(dest="action", required=True)
    block_actions.add_parser("register", help="register the block types (idempotent)")
    save = block_actions.add_parser("save", help="store a source file as a CollectorSource block")
    save.add_argument("name", help="block name (run it with source=block:NAME)")
    save.add_argument("file", metavar="SOURCE")
    blocks.set_defaults(func=cmd_blocks)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in ("batch_size", "max_items"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
