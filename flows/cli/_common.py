"""What every ``collector`` command shares: exit codes, the console, Prefect's quiet defaults."""

from __future__ import annotations

import os
import sys
from typing import Any

from collector.config import SourceError

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


def _prefect_server() -> None:
    """Use the user's Prefect API, or the local background server (started on first use)."""
    from flows.local_server import use_local_server

    use_local_server(say=lambda line: print(f"collector: {line}", file=sys.stderr))


def _console(stderr: bool = True) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def print_source_problems(error: SourceError) -> int:
    """Print each problem of an invalid source on its own line; the exit code for it."""
    for problem in error.problems:
        print(problem, file=sys.stderr)
    return EXIT_INVALID
