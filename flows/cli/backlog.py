"""``collector backlog SOURCE...``: sample each source's backlog now (the backlog-monitor flow).

The same flow the ``backlog-monitor`` deployment runs on a schedule, run once in this process:
it updates each source's level and trend (Prefect Variable and artifact) and emits an event on
a level change. Prints one line per source.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from collector.errors import CollectorError
from flows.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    _prefect_environment,
    _prefect_server,
    add_json,
    add_source,
    load,
)

if TYPE_CHECKING:
    from flows.cli._common import Commands


def cmd_backlog(args: argparse.Namespace) -> int:
    _prefect_environment()
    for reference in args.sources:
        load(reference)  # every source valid before Prefect starts (else exit 2, main)
    _prefect_server()
    from flows.backlog import backlog_monitor

    try:
        results = backlog_monitor(sources=list(args.sources))
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(results, default=str))
        return EXIT_OK
    for result in results:
        _print_result(result)
    return EXIT_OK


def _print_result(result: dict[str, Any]) -> None:
    event = f", event {result['event']}" if result["event"] else ""
    print(
        f"{result['source']}: depth {result['depth']} / capacity {result['capacity']}"
        f" = {100 * result['ratio']:.0f} % ({result['level']}{event})"
    )


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    backlog = commands.add_parser(
        "backlog", help="sample each source's backlog now (the backlog-monitor flow)"
    )
    add_source(backlog, many=True)
    add_json(backlog, "the samples")
    backlog.set_defaults(func=cmd_backlog)
