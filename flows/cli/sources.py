"""``collector schema`` and ``validate``: what a source file may say, and whether it does."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from collector.config import SourceError
from flows.cli._common import (
    EXIT_INVALID,
    EXIT_OK,
    add_source,
    load,
    print_warnings,
    seed_count,
)

if TYPE_CHECKING:
    from collector.config import Source
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
        source, problems = _problems(path)
        if source is None or problems:
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


def _problems(reference: str) -> tuple[Source | None, list[str]]:
    """Every problem of one source at once, in file order (collector.config.report): the
    model's, every seed line's (a load checks the first SEED_LINES_CHECKED) and GX's verdict on
    the suite's kwargs, so what the run would refuse after fetching is said before any fetch."""
    from flows.sources import block_name_of

    if block_name_of(reference) is None:
        from collector.config.report import validation_problems

        return validation_problems(Path(reference).expanduser())
    from collector.config import seed_file_problems, suite_kwargs_problems

    try:
        source = load(reference)
    except SourceError as exc:
        return None, exc.problems
    found = seed_file_problems(source, reference, first=None)
    return source, found + suite_kwargs_problems(source, reference)


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
