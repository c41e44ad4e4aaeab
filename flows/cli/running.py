"""``collector run``, ``work`` and ``demo``: a collect flow run in this process."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from collector import defaults
from collector.errors import CollectorError, ConfigError
from flows.cli._common import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    _console,
    _prefect_environment,
    _prefect_server,
)


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
    from collector.ops.observability import init_sentry, register_secrets

    init_sentry()  # only when SENTRY_DSN is set; fast options (see collector.ops.observability)
    register_secrets(loaded.secret_values())  # scrubbed from Sentry events and every log line
    if loaded.suite_path is not None:
        from collector.settle.validation_worker import prewarm

        prewarm(loaded.suite_path)  # GX imports on the other core while Prefect starts
    _prefect_server()  # after the checks above: a source that cannot run starts nothing
    from collector.run.locks import SourceBusy
    from collector.run.stop import EXIT_CODES, StoppedWaiting
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
    except StoppedWaiting as exc:
        progress.stop()
        print(f"collector: {exc}; nothing was claimed", file=sys.stderr)
        return EXIT_CODES.get(exc.reason, EXIT_FAILED), None
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
    if summary.interrupted:
        print(
            f"collector: interrupted by {summary.interrupted}: {summary.stored} stored, "
            f"{summary.returned + summary.released} returned to the queue unchanged, lock "
            "released; run again to continue",
            file=sys.stderr,
        )
        return EXIT_CODES.get(summary.interrupted, EXIT_FAILED), summary.as_dict()
    if summary.skipped:
        return EXIT_OK, summary.as_dict()
    return (EXIT_OK if summary.balanced else EXIT_FAILED), summary.as_dict()


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


def register(commands: Any) -> None:
    """Add this group's subcommands to ``collector``'s parser."""

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
