"""``collector blocks register|save``: Collector's block types, and sources kept as blocks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flows.cli._common import EXIT_OK, _prefect_environment, _prefect_server

if TYPE_CHECKING:
    from flows.cli._common import Commands


def cmd_blocks(args: argparse.Namespace) -> int:
    """Register block types, or save a source file as a block, on the current Prefect API."""
    _prefect_environment()
    _prefect_server()
    if args.action == "save":
        from collector.config import load_source

        load_source(args.file)  # the block must hold a valid source file (else exit 2, main)
    from blocks import register_block_types
    from blocks.source import CollectorSource

    slugs = register_block_types()
    if args.action == "register":
        print("registered block types: " + ", ".join(slugs))
        return EXIT_OK
    block = CollectorSource.from_file(args.file)
    block.save(args.name, overwrite=True, _sync=True)  # type: ignore[call-arg]
    print(f"saved collector-source/{args.name}: run it with source=block:{args.name}")
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    blocks = commands.add_parser("blocks", help="Prefect block types for sources and backends")
    block_actions = blocks.add_subparsers(dest="action", required=True, metavar="ACTION")
    block_actions.add_parser("register", help="register the block types (idempotent)")
    save = block_actions.add_parser("save", help="store a source file as a CollectorSource block")
    save.add_argument("name", help="block name (run it with source=block:NAME)")
    save.add_argument("file", metavar="SOURCE", help="the source file to store")
    blocks.set_defaults(func=cmd_blocks)
