"""The ``collector`` command.

``collector init NAME``              write a new source, a starter suite and its deployment entry
``collector schema``                 print the JSON schema of a source file
``collector validate SOURCE...``     check sources without running them (exit 2 when invalid)
``collector run SOURCE``             run the collect flow as a Prefect flow run
``collector work SOURCE``            help drain a running source's shared frontier (no plan)
``collector demo``                   start the local demo site and collect it
``collector deadletters list|show``  look at what failed and why
``collector deadletters retry|discard``  fetch again, or resolve with a reason that is kept
``collector review SOURCE``          settle escalated dead letters by hand (accept, discard)
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
import sys
from collections.abc import Sequence

from collector.errors import ConfigError
from flows.cli import (
    deadletters,
    init,
    prefect_blocks,
    recovery,
    review,
    running,
    server,
    sources,
)
from flows.cli._common import EXIT_BUSY, EXIT_FAILED, EXIT_INVALID, EXIT_OK
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

_GROUPS = (init, sources, running, deadletters, review, prefect_blocks, recovery, server)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collector", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for group in _GROUPS:
        group.register(commands)
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
