"""What every ``collector`` command shares: exit codes, the console, loading a source, Prefect's
quiet defaults."""

from __future__ import annotations

import argparse
import errno
import functools
import logging
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from collector.config import SourceError

if TYPE_CHECKING:
    from rich.console import Console

    from collector.config import Source

    Commands = argparse._SubParsersAction[argparse.ArgumentParser]
    """The ``collector`` command's subcommands, as each CLI module's ``register`` adds to them."""

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BUSY = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it (128 + SIGINT)
EXIT_PIPE_CLOSED = 141  # stdout closed early (`| head`), as shells report it (128 + SIGPIPE)
EXIT_TERMINATED = 143  # SIGTERM (a process worker's cancel, systemd, kill), 128 + SIGTERM
# Items left queued because hosts did not answer or their breaker stayed open (RunSummary.
# hosts_down): sysexits' EX_TEMPFAIL, "a temporary failure; the user is invited to retry later".
EXIT_HOSTS_DOWN = 75

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


# What the collect flow logs for the UI that `collector run` then says itself, in its own words:
# a run that left items queued for hosts that did not answer, a source whose every seed was
# refused (the flow's ERROR line, and the engine's "Finished in state Failed(...)" with it).
_SAID_BY_RUN = ("left queued: ", "was refused at plan (")


class _SaidByRunFilter(logging.Filter):
    """Drop, from the console only, the flow run records the command says itself (once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect.flow_runs"):
            return True
        text = record.getMessage()
        return not any(said in text for said in _SAID_BY_RUN)


def quiet_console_for_run() -> None:
    """Install :class:`_SaidByRunFilter` on Prefect's console handlers (this process only; the
    API handler is left alone, so the flow run's logs in the UI keep every line)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, _SaidByRunFilter) for f in handler.filters
        ):
            handler.addFilter(_SaidByRunFilter())


def _console(stderr: bool = True) -> Console:
    return _console_class()(stderr=stderr, highlight=False, soft_wrap=True)


@functools.cache
def _console_class() -> type[Console]:
    """rich's Console, but a closed pipe is a ``BrokenPipeError`` for ``main`` to handle.

    rich's own ``on_broken_pipe`` raises ``SystemExit(1)``, so ``collector run SRC | head``
    exited 1 or 141 depending on which write met the closed pipe; every command now ends the
    same way, the one Python's "Note on SIGPIPE" describes: stdout pointed at /dev/null and one
    exit code (:data:`EXIT_PIPE_CLOSED`, in ``main``).
    """
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more to write: the reader is gone
            raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")

    return PipeAwareConsole


def load(reference: str, *, look_only: bool = False) -> Source:
    """The source a command names: a file path or ``block:NAME`` (the flows' own resolver).

    An invalid source raises SourceError; ``main`` prints its problems, one per line, and exits
    2, so no command repeats that. Prefect is set up only when a block must be read.

    ``look_only`` for commands that only show a source's stores (status, batches, dead letters):
    a problem in what only a run uses (a suite being edited, a seed file, a hook) does not hide
    where the items are. The source's problems are then one note on stderr, not an exit 2.
    """
    from collector.config import SourceError
    from flows.sources import block_name_of, resolve_source

    if block_name_of(reference) is not None:
        _prefect_environment()
        _prefect_server()
    try:
        return resolve_source(reference)
    except SourceError as error:
        if not look_only:
            raise
        source = resolve_source(reference, deep=False)  # the model itself is wrong: raises
        count = len(error.problems)
        print(
            f"note: {error.problems[0]}"
            + (f" (and {count - 1} more)" if count > 1 else "")
            + f"; `collector validate {reference}` lists them, a run refuses the source until "
            "they are fixed",
            file=sys.stderr,
        )
        return source


STORE_FIELDS = ("frontier.", "deadletters.", "sink.")


def in_source(reference: str | None, message: str) -> str:
    """A store error that names its setting (``frontier.url redis://...: cannot connect``, from
    collector.backends) gets the source file in front, as source problems do: ``items.yaml:
    frontier.url ...``. Other messages (already naming a path) stay as they are."""
    if reference is None or not message.startswith(STORE_FIELDS):
        return message
    return f"{reference}: {message}"


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


def add_source(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
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


def add_json(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument(
        "--json", action="store_true", help=f"{what} as JSON on stdout (for scripts)"
    )


def when(epoch: float) -> str:
    """An epoch time as the commands show it: UTC, to the second (``2026-12-03 14:52:19Z``)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
