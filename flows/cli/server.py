"""``collector server status|stop``: the local Prefect server the command runs in the background."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from flows.cli._common import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from flows.cli._common import Commands


def cmd_server(args: argparse.Namespace) -> int:
    from flows.local_server import (
        configured_api_url,
        ensure_local_server,
        find_local_server,
        other_servers,
        stop_local_server,
    )

    if args.action == "stop":
        stopped = stop_local_server(say=lambda line: print(line, flush=True))
        print(f"stopped the local Prefect server at {stopped.ui}" if stopped
              else "no local Prefect server is running")  # fmt: skip
        return EXIT_OK
    if args.action == "start":
        try:
            started = ensure_local_server()
        except RuntimeError as exc:  # did not start or answer: one line, its log named in it
            print(f"collector: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"local Prefect server at {started.ui} (pid {started.pid})")
        return EXIT_OK
    configured = configured_api_url()
    server = find_local_server()
    if args.json:
        print(json.dumps({"configured_api_url": configured, "local": server and server.url}))
        return EXIT_OK if server or configured else EXIT_FAILED
    if configured:
        print(f"Prefect API configured by you: {configured} (the local server is not used)")
    for other in other_servers():  # same PREFECT_HOME, another venv: never used nor stopped here
        print(f"not used here: another install's server at {other.ui} ({other.python})")
    if server is None:
        print("no local Prefect server is running (the next `collector run` starts one)")
        return EXIT_OK if configured else EXIT_FAILED
    print(f"local Prefect server: {server.ui} (UI and API), pid {server.pid}, up "
          f"{time.time() - server.started_at:.0f} s, log {server.log}")  # fmt: skip
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    server = commands.add_parser(
        "server", help="the local Prefect server collector starts in the background",
        description="Without PREFECT_API_URL, `collector run` starts one local Prefect server "
        "in the background and reuses it (it stops by itself after 30 minutes idle).",
    )  # fmt: skip
    actions = server.add_subparsers(dest="action", required=True)
    status = actions.add_parser("status", help="show whether it runs, where, since when")
    status.add_argument("--json", action="store_true", help="one JSON object on stdout")
    actions.add_parser("start", help="start it now (commands start it when they need it)")
    actions.add_parser("stop", help="stop it (its runs stay in $PREFECT_HOME's database)")
    server.set_defaults(func=cmd_server)
