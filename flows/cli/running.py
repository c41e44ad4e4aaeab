"""``collector run``, ``work`` and ``demo``: a collect flow run in this process."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector import defaults
from collector.errors import CollectorError, ConfigError
from collector.run.account import END_TERMS, INTAKE_TERMS
from flows.cli._common import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_HOSTS_DOWN,
    EXIT_INVALID,
    EXIT_OK,
    _console,
    _prefect_environment,
    _prefect_server,
    add_source,
    in_source,
    load,
    positive_int,
    print_warnings,
    quiet_console_for_run,
)

if TYPE_CHECKING:
    from rich.console import Console

    from collector.config import Source
    from collector.run.summary import RunSummary
    from flows.cli._common import Commands


def _preflight(loaded: Source, *, role: str) -> list[str]:
    """Reach the stores and resolve every ``${env:}`` / ``${secret:}`` before Prefect starts,
    so a server that is down or a variable that is not set is one line, not a traceback.

    A run looks at a JSONL sink without its writer lock: the run holding the source lock holds
    that too, and this one is about to wait for (or skip) the source lock, not be refused by the
    sink (and runs starting together would refuse each other here). A ``work`` helper takes no
    source lock, so the sink's one-writer refusal is its one line, said before Prefect starts.

    Returns the warnings the stores give (:mod:`flows.cli._sink_hints`: a deleted sink folder,
    a renamed source), said before the run, which goes ahead: they change nothing.
    """
    from collector.backends import open_backends
    from collector.config import redis_url_checked
    from flows.cli._sink_hints import sink_folder, sink_hints

    folder = sink_folder(loaded)
    existed = folder is None or folder.is_dir()  # before a helper's writable sink makes it
    with open_backends(loaded, readonly_sink=role != "work") as stores:
        counts = stores.frontier.counts(loaded.name)
        hints = sink_hints(loaded, folder, existed=existed, done=counts.done, total=counts.total)
    loaded.resolved_headers()
    storage = loaded.limits.rate_storage
    resolved = loaded.resolve(storage, field="limits.rate_storage")
    if resolved != storage and resolved != "memory://":
        redis_url_checked(resolved, field="limits.rate_storage")
    return hints


def _run(source: str, args: argparse.Namespace) -> tuple[int, RunSummary | None, str | None]:
    """Run the collect flow; returns (exit code, summary or None, why seeds were refused).

    The last is looked up only after a run that ended normally and refused seeds at plan
    (:func:`_refusal_looked_up`): the message of one open ``plan/refused_url`` dead letter.

    The stop's signal handlers (:class:`collector.run.stop.StopRequest`) are installed first,
    whatever the process inherited: a shell's background job starts with SIGINT ignored, and
    Python leaves it ignored, so a SIGINT before the flow installs its own would be lost (one
    that came while the command imported was recorded by :mod:`flows.early_signals`). A stop
    requested before the flow starts ends the command there (nothing claimed); one requested
    while it starts is honoured by the flow (its ledger says ``interrupted``).
    """
    from collector.run.stop import process_stop
    from flows import early_signals

    process_stop.reset()  # a request of an earlier command in this process is not this one's
    try:
        with process_stop.on_signals():
            early = early_signals.hand_over()  # a signal while the command was importing
            if early is not None:
                process_stop.request(early)
            return _run_stoppable(source, args)
    finally:
        early_signals.restore()


def _stopped_before_the_flow() -> tuple[int, None, None] | None:
    """The command's end when a stop was requested before the flow started, else None."""
    from collector.run.stop import EXIT_CODES, process_stop

    reason = process_stop.reason
    if reason is None:
        return None
    print(f"collector: interrupted by {reason} before the run started; nothing was claimed",
          file=sys.stderr)  # fmt: skip
    return EXIT_CODES.get(reason, EXIT_FAILED), None, None


def _checked_before_the_flow(
    source: str, args: argparse.Namespace
) -> Source | tuple[int, None, None]:
    """The source, loaded and checked (variables set, stores reachable), or the exit code of
    a run that cannot start; said on stderr, one line each."""
    problem = _metrics_environment(getattr(args, "metrics_port", None))
    if problem:
        print(f"collector: {problem}", file=sys.stderr)
        return EXIT_INVALID, None, None
    _prefect_environment()
    loaded = load(source)  # an invalid source: its problems, exit 2 (main)
    from collector.config import unset_variables

    unset = unset_variables(loaded)
    if unset:  # every one at once, not the first of them per try
        for problem in unset:
            print(f"{source}: {problem}", file=sys.stderr)
        return EXIT_INVALID, None, None
    try:
        hints = _preflight(loaded, role=getattr(args, "role", "run"))
    except ConfigError as exc:  # a missing variable or Secret / RedisDatabase block
        print(f"{source}: {exc}", file=sys.stderr)
        return EXIT_INVALID, None, None
    except CollectorError as exc:  # a store that does not answer: its file and setting first
        print(f"collector: {in_source(source, str(exc))}", file=sys.stderr)
        return EXIT_FAILED, None, None
    print_warnings(loaded, source)  # e.g. every seed refused: said before, not discovered after
    for hint in hints:  # records a frontier holds done that the sink folder lacks
        print(f"{source}: warning: {hint}", file=sys.stderr)
    return loaded


def _observed(loaded: Source) -> None:
    """Sentry, tracing and the scrubbing of secrets, and GX warmed up, before Prefect starts."""
    from collector.ops.observability import init_sentry, register_secrets

    init_sentry()  # only when SENTRY_DSN is set; fast options (see collector.ops.observability)
    from collector.ops.tracing import init_tracing

    init_tracing()  # only when OTEL_* asks for export (see collector.ops.tracing)
    register_secrets(loaded.secret_values())  # scrubbed from Sentry events and every log line
    if loaded.suite_path is not None:
        from collector.settle.validation_worker import prewarm

        prewarm(loaded.suite_path)  # GX imports on the other core while Prefect starts


def _run_stoppable(
    source: str, args: argparse.Namespace
) -> tuple[int, RunSummary | None, str | None]:
    loaded = _checked_before_the_flow(source, args)
    if isinstance(loaded, tuple):
        return loaded
    if (stopped := _stopped_before_the_flow()) is not None:
        return stopped
    from flows.cli._progress import Progress

    shown = not args.json and sys.stderr.isatty()
    progress = Progress(enabled=shown, console=_console() if shown else None)
    progress.start("starting Prefect ...")  # the imports and server start take seconds
    summary: RunSummary | None = None
    try:
        _observed(loaded)
        _prefect_server()  # after the checks above: a source that cannot run starts nothing
        from collector.run.locks import SourceBusy
        from collector.run.stop import EXIT_CODES, EXIT_LOST_FOOTING, LostFooting, StoppedWaiting
        from flows._locks import quiet_console_for_the_command
        from flows.collect import run_collect
        from flows.sources import source_reference

        if (stopped := _stopped_before_the_flow()) is not None:
            progress.finish(None)
            return stopped
        quiet_console_for_the_command()  # busy, stopped, bad suite: said once below
        quiet_console_for_run()  # hosts down, every seed refused: said once below
        try:
            result = run_collect(
                source_reference(source),  # the run's parameter: absolute, as the UI shows it
                batch_size=args.batch_size,
                max_items=args.max_items,
                drain_wait_s=args.drain_wait,
                role=getattr(args, "role", "run"),
                on_busy=getattr(args, "on_busy", None),
                lock_wait_s=getattr(args, "lock_wait", None),
                idle_wait_s=getattr(args, "idle_wait", 0.0),
                listeners=[progress],
            )
        except SourceBusy as exc:
            progress.finish(None)
            print(f"collector: busy: {exc}", file=sys.stderr)
            return EXIT_BUSY, None, None
        except StoppedWaiting as exc:
            progress.finish(None)
            print(f"collector: {exc}; nothing was claimed", file=sys.stderr)
            return EXIT_CODES.get(exc.reason, EXIT_FAILED), None, None
        except LostFooting as exc:  # a lease, the heartbeat or the lock lost: exit 4
            progress.finish(exc.summary)
            print(f"collector: {exc}", file=sys.stderr)
            return EXIT_LOST_FOOTING, exc.summary, None  # its account, as after any ending
        except ConfigError as exc:
            progress.finish(None)
            print(f"{source}: {exc}", file=sys.stderr)
            return EXIT_INVALID, None, None
        except CollectorError as exc:
            progress.finish(None)
            print(f"collector: {exc}", file=sys.stderr)
            return EXIT_FAILED, None, None
        summary = result
    finally:
        progress.finish(summary)
    return _ended(result, loaded)


def _ended(result: RunSummary, loaded: Source) -> tuple[int, RunSummary, str | None]:
    """The exit code of a run that has a summary, and why seeds were refused (looked up)."""
    from collector.run.stop import EXIT_CODES

    if result.interrupted:
        print(f"collector: {result.interruption}", file=sys.stderr)
        return EXIT_CODES.get(result.interrupted, EXIT_FAILED), result, None
    refusal = _first_refusal(loaded) if _refusal_looked_up(result) else None
    if result.skipped:
        return EXIT_OK, result, refusal
    if result.all_refused:
        print(f"collector: {result.refused_all}", file=sys.stderr)
        return EXIT_FAILED, result, refusal
    if result.hosts_down:  # a dead site is not a success (exit 75, docs/cli.md)
        from collector.run.summary import host_line

        print(f"collector: {result.hosts_down_line}", file=sys.stderr)
        for host, facts in result.hosts_down.items():
            print(f"collector:   {host_line(host, facts)}", file=sys.stderr)
        return EXIT_HOSTS_DOWN, result, refusal
    return (EXIT_OK if result.balanced else EXIT_FAILED), result, refusal


def _refusal_looked_up(summary: RunSummary) -> bool:
    """Whether :func:`_run` looked up why seeds were refused: after a run that ended normally
    (not interrupted, not skipped) and refused seeds at plan."""
    return bool(summary.refused_at_plan) and not summary.interrupted and not summary.skipped


def _json_line(summary: RunSummary, refusal: str | None, **extra: Any) -> str:
    """``--json``'s line: the summary's fields, then ``refusal`` when it was looked up (null
    when no open entry says why), then ``extra`` (the demo's request count)."""
    data = summary.as_dict()
    if _refusal_looked_up(summary):
        data["refusal"] = refusal
    return json.dumps({**data, **extra}, default=str)


def _first_refusal(loaded: Source) -> str | None:
    """Why seeds were refused at plan: the message of one open ``plan/refused_url`` entry."""
    from collector.backends import open_deadletters

    store = open_deadletters(loaded)
    try:
        entries = store.list(source=loaded.name, stage="plan", status="open", limit=1)
    finally:
        store.close()
    return entries[0].message if entries else None


def _metrics_environment(port: int | None) -> str | None:
    """``--metrics-port``: Prefect's client metrics server (default registry) on ``port``.

    Returns a one-line problem when the port cannot be bound (Prefect would fail the flow run
    with a traceback when it starts the server)."""
    if port is not None:
        import socket

        try:
            with socket.socket() as probe:
                probe.bind(("", port))
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or exc  # OverflowError has no strerror
            return f"--metrics-port {port}: cannot listen there ({reason})"
    if port:
        os.environ["PREFECT_CLIENT_METRICS_ENABLED"] = "true"
        os.environ["PREFECT_CLIENT_METRICS_PORT"] = str(port)
        from collector.ops import metrics

        metrics.enable()
    return None


def _print_summary(summary: RunSummary, refusal: str | None = None) -> None:
    """The run's ledger as a table and what to know about it; ``refusal`` says why seeds were
    refused at plan (see :func:`_run`)."""
    console = _console(stderr=False)
    # On a terminal, long lines wrap between words (the terminal itself would cut a word in
    # two); piped, a line stays whole for whoever reads it.
    console.soft_wrap = not console.is_terminal
    if summary.skipped:
        console.print(f"skipped: another run of {summary.source} holds its source lock")
        return
    if summary.role == "work":
        _print_worker(summary, console)
        return
    if summary.hosts_down:  # exit 75: what is left and why come first, not a "balanced"
        console.print(f"[yellow]not done:     {_escaped(summary.hosts_down_line)}")
    _print_ledger_table(summary, console)
    _print_why_nothing(summary, console)
    verdict = "[green]balanced" if summary.balanced else "[red]NOT balanced"
    if summary.balanced and summary.hosts_down:
        verdict = "[yellow]balanced, but not done[/] (every item accounted for; some queued)"
    rejected = summary.records_quarantined  # records, each a dead letter (key or suite failed)
    console.print(
        f"conservation: {verdict}   records written {summary.records_written}, "
        f"unchanged {summary.records_unchanged}, rejected {rejected}"
        f"{' (failed record.key or the suite: dead letters)' if rejected else ''}   "
        f"{summary.pages_per_second} pages/s   "
        f"{summary.requests} requests, {summary.retries} retries"
    )
    if summary.stale_writes:
        console.print(
            f"fencing:      {summary.stale_writes} record writes refused (a newer lease "
            "holder had written them)"
        )
    for problem in summary.problems:
        console.print(f"[red]  {_escaped(problem)}")
    _print_key_collisions(summary, console)
    _print_slowed(summary, console)
    _print_plan_notes(summary, refusal, console)
    console.print(f"records:      {summary.sink}")
    console.print(f"dead letters: {summary.deadletters} (archive {summary.deadletter_archive})")


def _print_worker(summary: RunSummary, console: Console) -> None:
    """A drain-only worker's whole ledger: its claim check, in one line."""
    verdict = "[green]balanced" if summary.balanced else "[red]NOT balanced"
    console.print(
        f"worker of {summary.source}: claimed {summary.claimed} = stored "
        f"{summary.stored} + dead {summary.dead_lettered} + returned "
        f"{summary.returned} + stale {summary.stale_acks} + released "
        f"{summary.released}: {verdict}"
    )
    for problem in summary.problems:
        console.print(f"[red]  {problem}")
    if summary.claimed == 0 and not (summary.interrupted or summary.lost):
        # "claimed 0 ... balanced" alone read as a source with nothing to do; on a source
        # never run, a newcomer expected the helper to collect it
        console.print(
            f"nothing claimed: no item of {summary.source} was queued within --idle-wait; a "
            "worker only helps drain what `collector run` planned (it never plans the seeds)"
        )
    _print_key_collisions(summary, console)


def _print_ledger_table(summary: RunSummary, console: Console) -> None:
    """The ledger table (rows from :func:`ledger_rows`)."""
    from rich.table import Table

    table = Table(title=f"Ledger of {summary.source}", show_header=True)
    table.add_column("terminal state")
    table.add_column("items", justify="right")
    table.add_column("of which")
    for row in ledger_rows(summary):
        if row is None:
            table.add_section()
        else:
            table.add_row(*row)
    console.print(table)


def _print_why_nothing(summary: RunSummary, console: Console) -> None:
    """Why a run fetched nothing, and who still held items: a no-op is not a failure."""
    refused = summary.refused_at_plan
    if summary.requests == 0 and summary.discovered:
        why = [
            f"{count} {what}"
            for count, what in (
                (summary.fresh_skipped, "still fresh"),
                (summary.expired, "expired in the queue (due again next run)"),
                (summary.already_dead, "already dead from earlier runs"),
                (refused, "refused at plan"),
                (summary.held_by_others, "held by helpers"),
                (summary.queued, "left queued"),
            )
            if count
        ]
        if summary.interrupted:  # stopped before its first fetch: not a no-op, not done
            note = f" (stopped by {summary.interrupted} first: run again to continue)"
        else:
            note = "" if refused else " (a no-op run, not a failure)"
        console.print(f"nothing fetched: {', '.join(why) or 'no item was claimed'}{note}")
    if summary.held_by_others:
        console.print(
            f"held by helpers: {summary.held_by_others} items were still leased by live "
            "`collector work` helpers when this run ended; they settle them"
        )
    if summary.requests == 0 and not summary.discovered and summary.plan == "incremental":
        fresh = f" ({summary.fresh_uncounted} still fresh)" if summary.fresh_uncounted else ""
        console.print(
            "nothing was due: the seed list is unchanged since the last plan, and no page is "
            f"queued or past its freshness{fresh} (a no-op run, not a failure; dead pages wait "
            "for `collector triage`)"
        )


def _print_plan_notes(summary: RunSummary, refusal: str | None, console: Console) -> None:
    """What the plan did beside the table: renewed, re-planned and refused seeds."""
    refused = summary.refused_at_plan
    if summary.fresh_uncounted:
        console.print(
            f"fresh:        {summary.fresh_uncounted} items are still fresh from earlier runs "
            f"and were not fetched; the {summary.plan} plan reads only what is due, so they "
            "are in neither discovered nor fresh_skipped"
        )
    if summary.renewed:
        console.print(
            f"renewed:      {summary.renewed} queued items an earlier run left were past their "
            "queue TTL; this plan asked for them again (ttl.queue_ttl_s)"
        )
    if summary.replanned:
        console.print(
            f"re-planned:   {summary.replanned} seeds refused by earlier runs are allowed "
            "now; their dead letters were closed and the URLs queued"
        )
    if refused:
        from rich.markup import escape  # a masked URL's [redacted] is text, not a style tag

        console.print(
            f"[yellow]refused:      {refused} seed URL{'s' * (refused != 1)} before fetching: "
            f"{escape(refusal or 'see the dead letters at stage plan')}"
        )


def ledger_rows(summary: RunSummary) -> list[tuple[str, str, str] | None]:
    """The ledger table's rows (``None`` is the line between them), from the account's terms
    (collector.run.account): the terminal states above the line, what the run took in below
    it, then the total. A term shows as its definition says (always, or only when not zero, so
    a plain run's table stays short), with its note when it is not zero."""
    notes = {
        "dead_lettered": ", ".join(
            part
            for part in (
                f"{summary.already_dead} already dead from earlier runs (not fetched)"
                if summary.already_dead
                else "",
                f"{summary.refused_at_plan} refused at plan" if summary.refused_at_plan else "",
            )
            if part
        ),
        "unlisted": f"no longer listed: {summary.carried_over} collected again, "
        f"{summary.retired} retired",
    }
    zero_notes = {"fresh_skipped": _fresh_uncounted_note(summary)}
    rows: list[tuple[str, str, str] | None] = []
    for terms in (END_TERMS, INTAKE_TERMS):
        for term in terms:
            count = getattr(summary, term.name)
            if term.table == "always" or (count and term.table == "nonzero"):
                note = notes.get(term.name, term.note) if count else zero_notes.get(term.name, "")
                rows.append((term.name, str(count), note))
        rows.append(None)
    intake = sum(getattr(summary, term.name) for term in INTAKE_TERMS)
    rows[-1] = ("[bold]total", f"[bold]{intake}", "")
    return rows


def _fresh_uncounted_note(summary: RunSummary) -> str:
    """What the ``fresh_skipped`` row says when it is 0 only because the plan did not look."""
    if not summary.fresh_uncounted:
        return ""
    return f"{summary.plan} plan: {summary.fresh_uncounted} fresh not counted (see below)"


def _escaped(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _print_slowed(summary: RunSummary, console: Console) -> None:
    """One line per host the politeness controls slowed down, and why (when the engine says)."""
    from rich.markup import escape

    slowed: dict[str, str] = summary.hosts.get("slowed") or {}
    for host, why in slowed.items():
        console.print(f"slowed:       {escape(host)}: {escape(str(why))}")


def _print_key_collisions(summary: RunSummary, console: Console) -> None:
    """Records this run stored under a key an earlier record of the run had (the sink keeps
    the later one): how many, and one example."""
    from rich.markup import escape

    if not summary.key_collisions:
        return
    example = summary.key_collision
    where = (
        f" (e.g. key {example['key']!r} from {example['first_url']}, then from "
        f"{example['later_url']})"
        if example
        else ""
    )
    console.print(
        f"[yellow]key collisions: {summary.key_collisions} records replaced an earlier record "
        f"of this run with the same key{escape(where)}; the sink keeps one record per key: "
        "check record.key"
    )


def _hold_metrics(args: argparse.Namespace, summary: RunSummary | None) -> None:
    """``--metrics-hold``: after the summary is printed, keep serving the final values so a
    scraper sees them; said on stderr, and a Ctrl-C ends the hold at once (the run's exit code
    stands). No hold after a run that was stopped or never ran: the user wants out."""
    seconds = getattr(args, "metrics_hold", 0.0)
    if not getattr(args, "metrics_port", None) or seconds <= 0 or summary is None:
        return
    if summary.interrupted:
        return
    sys.stdout.flush()
    try:  # from before the line is printed: a Ctrl-C as soon as it shows ends the hold too
        print(f"collector: serving the final metrics on port {args.metrics_port} for "
              f"{seconds:g} s (--metrics-hold); Ctrl-C ends it now", file=sys.stderr)  # fmt: skip
        time.sleep(seconds)
    except KeyboardInterrupt:
        print("collector: metrics hold ended", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    code, summary, refusal = _run(args.source, args)
    if summary is not None:
        if args.json:
            print(_json_line(summary, refusal))
        else:
            _print_summary(summary, refusal)
    _hold_metrics(args, summary)
    return code


# --- demo ---------------------------------------------------------------------------------------
def _flow_run_url(run_id: str) -> str | None:
    """The flow run's page in the Prefect UI (``PREFECT_UI_URL``, else derived from the API's)."""
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=run_id)  # None without a lasting server (no API URL)


def cmd_demo(args: argparse.Namespace) -> int:
    """Collect the bundled fault site. Its folder is a temporary one, removed at the end,
    unless ``--workdir`` names one to keep (to look at the records or run triage after)."""
    if args.workdir:
        return _demo(Path(args.workdir), args)
    with tempfile.TemporaryDirectory(prefix="collector-demo-") as folder:
        return _demo(Path(folder), args)


def _demo(folder: Path, args: argparse.Namespace) -> int:
    from collector.demo.scenario import FAULT_PATHS, write_demo_source
    from collector.demo.site import FaultSite

    console = _console(stderr=False)
    with FaultSite() as site:
        source = write_demo_source(folder, site.base_url)
        if not args.json:
            console.print(f"[bold]Collector demo[/]: demo site at {site.base_url}, source {source}")
            console.print("Deliberate faults in the seeds:")
            for path, expected in FAULT_PATHS.items():
                console.print(f"  {path:48} -> {expected}")
        code, summary, refusal = _run(str(source), args)
        if summary is None:
            return code
        site_requests = site.request_count()
    if args.json:
        print(_json_line(summary, refusal, demo_site_requests=site_requests))
        _hold_metrics(args, summary)
        return code
    _print_summary(summary, refusal)
    _show_records(Path(summary.sink), console)
    _show_dead_letters(source, console)
    where = _flow_run_url(summary.run_id)
    if where:
        console.print(f"\nThis run in the Prefect UI (its progress, ledger, dead letters, logs):"
                      f"\n  {where}", soft_wrap=True)  # fmt: skip
    if not args.workdir:
        console.print("\n(the demo's folder is removed now; keep it with --workdir DIR)")
    _hold_metrics(args, summary)
    return code


def _show_records(folder: Path, console: Console, limit: int = 3) -> None:
    console.print("\n[bold]A few stored records[/]")
    shown = 0
    for file in sorted(folder.glob("*.jsonl")):
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                console.print("  " + _escaped(line.strip()[:160]))
                shown += 1
                if shown >= limit:
                    return


def _show_dead_letters(source_path: Path, console: Console) -> None:
    from collector.backends import open_deadletters

    source = load(str(source_path))
    store = open_deadletters(source)
    try:
        entries = store.list(source=source.name, limit=50)
    finally:
        store.close()
    console.print(f"\n[bold]Dead letters ({len(entries)} open)[/]")
    for entry in entries:
        console.print(
            _escaped(
                f"  {entry.stage:8} {entry.error_class:30} {entry.url}\n"
                f"           {entry.message[:120]} (attempts {entry.attempts})"
            )
        )


def seconds(text: str) -> float:
    """An argparse type for waits (``--drain-wait``, ``--lock-wait``, ``--idle-wait``,
    ``--metrics-hold``): a finite number of seconds, 0 or more, refused with the subcommand's
    usage line. A negative one reached the flow's parameters and ended in Prefect's traceback
    (exit 1) after the server had started."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, not {text}")
    return value


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""

    def run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--batch-size", type=positive_int, default=defaults.BATCH_SIZE, metavar="N",
            help=f"items claimed, fetched and stored per task (default {defaults.BATCH_SIZE})",
        )  # fmt: skip
        p.add_argument(
            "--max-items", type=positive_int, default=None, metavar="N",
            help="stop claiming after N items (default: until the frontier drains)",
        )  # fmt: skip
        p.add_argument(
            "--drain-wait", type=seconds, default=defaults.DRAIN_WAIT_S, metavar="SECONDS",
            help="how long to wait for retry-later items and others' leases",
        )  # fmt: skip
        p.add_argument("--json", action="store_true", help="one JSON summary on stdout's last line")
        p.add_argument(
            "--metrics-port", type=int, default=None, metavar="N",
            help="serve Prometheus metrics on this port while running (docs/observability.md)",
        )  # fmt: skip
        p.add_argument(
            "--metrics-hold", type=seconds, default=0.0, metavar="SECONDS",
            help="with --metrics-port: keep serving this long after the run (a last scrape)",
        )  # fmt: skip

    run = commands.add_parser("run", help="run the collect flow for a source")
    add_source(run)
    run_options(run)
    run.add_argument(
        "--on-busy", choices=["wait", "skip"], default=None,
        help="when another run holds the source lock (default: the source's locks.on_busy)",
    )  # fmt: skip
    run.add_argument(
        "--lock-wait", type=seconds, default=None, metavar="SECONDS",
        help="how long 'wait' waits for the source lock, then exit 3 (default: locks.wait_s)",
    )  # fmt: skip
    run.set_defaults(func=cmd_run, role="run")

    work = commands.add_parser(
        "work", help="help drain a source's shared frontier (no plan, no source lock)"
    )
    add_source(work)
    run_options(work)
    work.add_argument(
        "--idle-wait", type=seconds, default=defaults.WORK_IDLE_WAIT_S, metavar="SECONDS",
        help="how long to wait for items to appear when the frontier has none",
    )  # fmt: skip
    work.set_defaults(func=cmd_run, role="work")

    demo = commands.add_parser("demo", help="collect the bundled local demo site")
    demo.add_argument(
        "--workdir", default=None, metavar="DIR",
        help="folder for the demo, kept afterwards (default: a temporary folder, removed)",
    )  # fmt: skip
    run_options(demo)
    demo.set_defaults(func=cmd_demo)
