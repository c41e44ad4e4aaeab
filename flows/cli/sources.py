"""``collector schema`` and ``validate``: what a source file may say, and whether it does."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from collector.config import SourceError, seed_file_problems, suite_kwargs_problems
from flows.cli._common import (
    EXIT_INVALID,
    EXIT_OK,
    add_source,
    load,
    print_warnings,
    seed_count,
)

if TYPE_CHECKING:
    from flows.cli._common import Commands


def cmd_schema(args: argparse.Namespace) -> int:
    from collector.config import source_json_schema

    print(json.dumps(source_json_schema(), indent=2))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 2 when any source is invalid; warnings (valid, but likely to fail at run time: an
    unset ``${env:}`` variable, seeds the URL policy refuses) are printed and exit 0."""
    status = EXIT_OK
    for path in args.sources:
        try:
            source = load(path)
        except SourceError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            status = EXIT_INVALID
            continue
        # every line of a seed file (a load checks the first SEED_LINES_CHECKED), and GX's own
        # kwargs check (imports GX: seconds, only when there is a suite), so what the run would
        # refuse after fetching is said here, before any fetch
        problems = seed_file_problems(source, path, first=None)
        problems += suite_kwargs_problems(source, path)
        if problems:
            for problem in problems:
                print(problem, file=sys.stderr)
            status = EXIT_INVALID
            continue
        urls = seed_count(source)
        warned = print_warnings(source, path)
        note = f", {len(warned)} warning{'s' if len(warned) != 1 else ''}" if warned else ""
        seeds = f"{urls} seed URL{'s' * (urls != 1)}"
        print(f"{path}: ok ({source.name}: {seeds}, sink {source.sink_label}{note})")
    return status


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    commands.add_parser("schema", help="print the JSON schema of a source file").set_defaults(
        func=cmd_schema
    )

    validate = commands.add_parser(
        "validate", help="check source files without running them (warnings do not fail)"
    )
    add_source(validate, many=True)
    validate.set_defaults(func=cmd_validate)
