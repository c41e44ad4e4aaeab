"""The ``collector`` command: collect web data into a sink, every item accounted for.

``collector init NAME``              write a new source, a starter suite and its deployment entry
``collector schema``                 print the JSON schema of a source file
``collector validate SOURCE...``     check sources without running them (exit 2 when invalid)
``collector status SOURCE...``       where a source's items are now (frontier, dead letters, sink)
``collector run SOURCE``             run the collect flow as a Prefect flow run
``collector work SOURCE``            help drain a running source's shared frontier (no plan)
``collector deploy SOURCE...``      one Prefect deployment per source (schedule, queue, trigger)
``collector fleet``                 start/stop the deployed sources' helpers by priority and load
``collector demo``                   start the local demo site and collect it
``collector deadletters list|show``  look at what failed and why
``collector deadletters retry|discard``  fetch again, or resolve with a reason that is kept
``collector review SOURCE``          settle escalated dead letters by hand (accept, discard)
``collector triage SOURCE``          run the triage flow (repair, replay, re-enqueue, escalate)
``collector batches SOURCE``         list the written batches (what compensate and audit name)
``collector compensate SOURCE --batch ID``  undo exactly one batch's writes (recorded)
``collector audit SOURCE``           check written batches against the current suite's table-level
                                     expectations; compensate each batch that fails
``collector backlog SOURCE...``      sample each source's backlog (the backlog-monitor flow)
``collector blocks register``        register Collector's Prefect block types (UI-editable)
``collector blocks save NAME FILE``  store a source file as a ``CollectorSource`` block
``collector server status|start|stop``  the local Prefect server every command reuses

SOURCE is a file path or ``block:NAME`` everywhere (one resolver, :mod:`flows.sources`).
Prefect is imported only by the commands that run flows, so ``validate`` and ``schema`` answer
at once. Exit codes (per command in docs/cli.md): 0 ok (or skipped: the source was busy and
``on_busy`` is skip), 1 the run did not balance or failed, 2 invalid input, 3 the source was
busy: another run held its lock for the whole wait, 75 items left queued because hosts did not
answer (``run``), 130 interrupted (Ctrl-C), 141 stdout was closed early (``| head``), 143
stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from collector.config import SourceError
from collector.errors import BackendError, ConfigError
from flows.cli import (
    backlog,
    deadletters,
    deploy,
    init,
    prefect_blocks,
    recovery,
    review,
    running,
    server,
    sources,
    status,
)
from flows.cli._common import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    in_source,
    print_source_problems,
)
from flows.cli.deadletters import parse_age

__all__ = [
    "EXIT_BUSY",
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "build_parser",
    "main",
    "parse_age",
]

_GROUPS = (
    init,
    sources,
    status,
    running,
    deploy,
    deadletters,
    review,
    recovery,
    backlog,
    prefect_blocks,
    server,
)


_DESCRIPTION = "Collect web data into a sink, every item accounted for."
_EPILOG = (
    "SOURCE is a source file or block:NAME. Exit codes: 0 ok, 1 failed or not balanced, "
    "2 invalid input, 3 source busy, 75 items left queued: hosts did not answer, "
    "130 interrupted, 141 output closed early, 143 terminated (SIGTERM). Details: docs/cli.md"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collector", description=_DESCRIPTION, epilog=_EPILOG)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in _GROUPS:
        group.register(commands)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand's own ``--help`` page its one-line summary as description (the
    ``help=`` of ``add_parser`` shows only in the parent's list), at every level."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        summaries = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            summary = summaries.get(name)
            if sub.description is None and summary:
                sub.description = summary[0].upper() + summary[1:] + "."
            _describe(sub)


def _one_source(args: argparse.Namespace) -> str | None:
    """The source file (or ``block:NAME``) the command names, when it names one."""
    source = getattr(args, "source", None)
    if isinstance(source, str):
        return source
    sources = getattr(args, "sources", None)
    if isinstance(sources, list) and len(sources) == 1 and isinstance(sources[0], str):
        return sources[0]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at exit
        return code
    except SourceError as exc:
        return print_source_problems(exc)
    except ConfigError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except BackendError as exc:  # a store that cannot open (Redis down, a sink folder refused)
        print(f"collector: {in_source(_one_source(args), str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # `collector ... | head`: the reader has all it wanted. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not fail again, and exit as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
