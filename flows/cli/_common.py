"""What every ``collector`` command shares: exit codes, the console, loading a source, Prefect's
quiet defaults."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from collector.config import SourceError

if TYPE_CHECKING:
    from collector.config import Source

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BUSY = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it (128 + SIGINT)
EXIT_PIPE_CLOSED = 141  # stdout closed early (`| head`), as shells report it (128 + SIGPIPE)

# Quiet, offline defaults for the embedded Prefect server; the user's own settings win.
# Only the *console* handler is raised to WARNING: Prefect's loggers stay at INFO, so a run
# against a real server still sends its logs to the UI (the API handler), while the terminal
# shows Collector's own progress and summary instead of Prefect's INFO lines.
_PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
    "PREFECT_LOGGING_SERVER_LEVEL": "ERROR",
    "PREFECT_UI_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",  # the client-side telemetry notice and calls (offline by design)
}

# Prefect's background services log under their class names. At exit the events worker says
# "Still processing items: N items remaining..." while it flushes, which it then does: noise
# printed after the command's own answer, so only its errors are shown.
_QUIET_SERVICE_LOGGERS = ("EventsWorker", "APILogWorker")


def _prefect_environment() -> None:
    for name, value in _PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    for name in _QUIET_SERVICE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _prefect_server() -> None:
    """Use the user's Prefect API, or the local background server (started on first use)."""
    from flows.local_server import use_local_server

    use_local_server(say=lambda line: print(f"collector: {line}", file=sys.stderr))


def _console(stderr: bool = True) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def load(reference: str) -> Source:
    """The source a command names: a file path or ``block:NAME`` (the flows' own resolver).

    An invalid source raises SourceError; ``main`` prints its problems, one per line, and exits
    2, so no command repeats that. Prefect is set up only when a block must be read.
    """
    from flows.sources import block_name_of, resolve_source

    if block_name_of(reference) is not None:
        _prefect_environment()
        _prefect_server()
    return resolve_source(reference)


def print_source_problems(error: SourceError) -> int:
    """Print each problem of an invalid source on its own line; the exit code for it."""
    for problem in error.problems:
        print(problem, file=sys.stderr)
    return EXIT_INVALID


def print_warnings(source: Source, reference: str) -> list[str]:
    """Print what may go wrong with a valid source (``collector.config.source_warnings``)."""
    from collector.config import source_warnings

    found = source_warnings(source)
    for warning in found:
        print(f"{reference}: warning: {warning}", file=sys.stderr)
    return found


def seed_count(source: Source) -> int:
    """How many distinct seed URLs the source lists.

    A template alone is counted by its range (distinct numbers give distinct URLs, as the
    template must hold ``{i}``), so `validate` and `init` stay instant and small on a 10 M URL
    catalogue; lists and seed files are counted distinct (`Source.iter_seed_urls`).
    """
    seeds = source.seeds
    if not seeds.urls and seeds.file is None and seeds.range is not None:
        start, stop = seeds.range
        return max(0, stop - start)
    return sum(1 for _ in source.iter_seed_urls())


SOURCE_HELP = "a source file (YAML or JSON), or block:NAME for a CollectorSource block"


def add_source(parser: Any, *, many: bool = False) -> None:
    """The ``SOURCE`` argument every command takes, with one help text."""
    if many:
        parser.add_argument("sources", nargs="+", metavar="SOURCE", help=SOURCE_HELP)
    else:
        parser.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)


def positive_int(text: str) -> int:
    """An argparse type for counts (``--batch-size``, ``--max-items``, ``--limit``): at least 1,
    so a bad value is refused with the subcommand's own usage line."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_json(parser: Any, what: str = "the result") -> None:
    parser.add_argument(
        "--json", action="store_true", help=f"{what} as JSON on stdout (for scripts)"
    )
