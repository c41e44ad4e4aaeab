"""``collector deadletters list|show|retry|discard``: see what failed, fetch again, or close."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from collector.errors import ConfigError
from flows.cli._common import EXIT_FAILED, EXIT_INVALID, EXIT_OK

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d``, ``1w`` -> seconds (argparse type)."""
    match = _AGE.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 90s, 15m, 2h, 3d or 1w")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def _store_for(source_path: str) -> tuple[Any, Any]:
    """The source and its dead-letter store (whichever backend the source names)."""
    from collector.backends import open_deadletters
    from collector.config import load_source

    source = load_source(source_path)
    return source, open_deadletters(source)


def _selected(source: Any, store: Any, args: argparse.Namespace) -> list[Any]:
    """The entries named by id, or those matching the filters (at least one is required)."""
    if args.ids:
        entries = []
        for entry_id in args.ids:
            entry = store.get(entry_id)
            if entry is None or entry.source != source.name:
                raise ConfigError(f"no dead letter with id {entry_id!r} in {source.name}")
            entries.append(entry)
        return entries
    if not (args.stage or args.error_class or args.older_than is not None or args.all):
        raise ConfigError("name entries by id, or select them with --stage, --error-class,"
                          " --older-than or --all")  # fmt: skip
    return list(
        store.list(
            source=source.name,
            stage=args.stage,
            error_class=args.error_class,
            status="open",
            limit=args.limit,
            first_seen_before=None if args.older_than is None else time.time() - args.older_than,
        )
    )


def _discard_reason(args: argparse.Namespace) -> str | None:
    if args.reason:
        return str(args.reason).strip() or None
    if not sys.stdin.isatty():
        return None
    try:
        return input("Reason for discarding (kept with each entry): ").strip() or None
    except EOFError:
        return None


def cmd_deadletters(args: argparse.Namespace) -> int:
    source, store = _store_for(args.source)
    try:
        if args.action == "list":
            entries = store.list(
                source=source.name,
                stage=args.stage,
                error_class=args.error_class,
                status=None if args.status == "all" else args.status,
                limit=args.limit,
                first_seen_before=None
                if args.older_than is None
                else time.time() - args.older_than,
            )
            if args.json:
                print(json.dumps([e.to_dict() for e in entries], default=str))
            for entry in [] if args.json else entries:
                where = f"{entry.stage:8} {entry.error_class:28}"
                print(f"{entry.id}  {entry.status:8} {where} {entry.url}")
            return EXIT_OK
        if args.action == "show":
            entry = store.get(args.id)
            if entry is None:
                print(f"no dead letter with id {args.id!r}", file=sys.stderr)
                return EXIT_INVALID
            print(json.dumps(entry.to_dict(), indent=2, default=str))
            return EXIT_OK
        if args.action == "discard":
            return _discard(source, store, args)
        return _retry(source, store, args)
    finally:
        store.close()


def _discard(source: Any, store: Any, args: argparse.Namespace) -> int:
    entries = _selected(source, store, args)
    reason = _discard_reason(args)
    if reason is None:
        print("collector: discard needs a reason (--reason TEXT, or answer the prompt)",
              file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    done = sum(store.resolve(e.id, "discarded", reason) for e in entries)
    print(f"discarded {done} of {len(entries)} dead letters ({len(entries) - done} were not open)")
    return EXIT_OK


def _retry(source: Any, store: Any, args: argparse.Namespace) -> int:
    """Fetch the entries' pages again: back to the frontier's queue if dead (or expired),
    whatever the entry's status (a repaired entry's page may still be dead); each entry not
    resolved yet is resolved once. Exit 1 when a page was not dead, so nothing was done."""
    from collector.backends import open_frontier

    entries = _selected(source, store, args)
    requeued = refused = 0
    queued_urls: set[str] = set()
    with open_frontier(source) as frontier:
        for entry in entries:
            if entry.url not in queued_urls:
                if not frontier.requeue(
                    source.name, [entry.url], now=time.time(), queue_ttl_s=source.ttl.queue_ttl_s
                ):
                    refused += 1
                    print(f"{entry.id}: the frontier does not hold {entry.url} as dead or expired;"
                          " not re-enqueued", file=sys.stderr)  # fmt: skip
                    continue
                queued_urls.add(entry.url)
            if entry.status != "resolved":
                store.resolve(entry.id, "reenqueued", "operator retry", requeued=True)
            requeued += 1
    print(f"re-enqueued {requeued} of {len(entries)} dead letters; the next run fetches them")
    return EXIT_OK if not refused else EXIT_FAILED


def register(commands: Any) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    letters = commands.add_parser("deadletters", help="inspect dead letters")
    letter_actions = letters.add_subparsers(dest="action", required=True)
    listing = letter_actions.add_parser("list")
    listing.add_argument("source", metavar="SOURCE")
    listing.add_argument("--stage", default=None)
    listing.add_argument("--error-class", default=None)
    listing.add_argument("--status", default="open", choices=["open", "review", "resolved", "all"])
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    listing.add_argument(
        "--older-than", type=parse_age, default=None, metavar="AGE",
        help="first seen longer ago than AGE (90s, 15m, 2h, 3d, 1w)",
    )  # fmt: skip
    show = letter_actions.add_parser("show")
    show.add_argument("source", metavar="SOURCE")
    show.add_argument("id")
    for name, helptext in (
        ("retry", "fetch the entries' URLs again (back to the frontier's queue)"),
        ("discard", "resolve entries as discarded, with a reason that is kept"),
    ):
        act = letter_actions.add_parser(name, help=helptext)
        act.add_argument("source", metavar="SOURCE")
        act.add_argument("ids", nargs="*", metavar="ID")
        act.add_argument("--stage", default=None)
        act.add_argument("--error-class", default=None)
        act.add_argument("--older-than", type=parse_age, default=None, metavar="AGE")
        act.add_argument("--all", action="store_true", help="every open entry of the source")
        act.add_argument("--limit", type=int, default=10_000)
        if name == "discard":
            act.add_argument("--reason", default=None, help="required when not interactive")
    letters.set_defaults(func=cmd_deadletters)
