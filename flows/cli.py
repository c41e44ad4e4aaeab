"""The ``collector`` command.

``collector schema``                 print the JSON schema of a source file
``collector validate SOURCE...``     check sources without running them (exit 2 when invalid)
``collector run SOURCE``             run the collect flow as a Prefect flow run
``collector demo``                   start the local demo site and collect it
``collector deadletters list|show``  look at what failed and why

Prefect is imported only by the commands that run flows, so ``validate`` and ``schema`` answer
at once. Exit codes: 0 ok, 1 the run did not balance or failed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector import defaults
from collector.errors import CollectorError, ConfigError

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2

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
        print(f"{path}: ok ({source.name}: {urls} seed URLs, sink {source.sink_path})")
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
    from collector.backends import open_deadletters, open_frontier

    try:  # reach the stores before Prefect starts: one line if one is down, not a traceback
        frontier = open_frontier(loaded)
        try:
            open_deadletters(loaded).close()
        finally:
            frontier.close()
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED, None
    from collector.observability import init_sentry, register_secrets

    if init_sentry():  # only when SENTRY_DSN is set; fast options (see collector.observability)
        register_secrets(loaded.secret_values())
    if loaded.suite_path is not None:
        from collector.validation_worker import prewarm

        prewarm(loaded.suite_path)  # GX imports on the other core while Prefect starts
    from flows.collect import progress_listeners, run_collect

    progress = _Progress(enabled=not args.json and sys.stderr.isatty())
    progress_listeners.append(progress)
    try:
        summary = run_collect(
            source,
            batch_size=args.batch_size,
            max_items=args.max_items,
            drain_wait_s=args.drain_wait,
        )
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
    return (EXIT_OK if summary["balanced"] else EXIT_FAILED), summary


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    console = _console(stderr=False)
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
def _store_for(source_path: str) -> tuple[Any, Any]:
    from collector.config import load_source
    from collector.deadletter import SqliteDeadLetterStore

    source = load_source(source_path)
    return source, SqliteDeadLetterStore(
        source.deadletter_path, archive=source.deadletter_archive_path
    )


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
            )
            if args.json:
                print(json.dumps([e.to_dict() for e in entries], default=str))
            for entry in [] if args.json else entries:
                where = f"{entry.stage:8} {entry.error_class:28}"
                print(f"{entry.id}  {entry.status:8} {where} {entry.url}")
            return EXIT_OK
        entry = store.get(args.id)
        if entry is None:
            print(f"no dead letter with id {args.id!r}", file=sys.stderr)
            return EXIT_INVALID
        print(json.dumps(entry.to_dict(), indent=2, default=str))
        return EXIT_OK
    finally:
        store.close()


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
    run.set_defaults(func=cmd_run)

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
    show = letter_actions.add_parser("show")
    show.add_argument("source", metavar="SOURCE")
    show.add_argument("id")
    letters.set_defaults(func=cmd_deadletters)
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
