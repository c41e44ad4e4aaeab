"""``collector deadletters list|show|retry|discard``: see what failed, fetch again, or close."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any, get_args

from collector.deadletter.base import CAUSES, RESOLUTION_KINDS, Stage
from collector.errors import ConfigError
from flows.cli._common import EXIT_FAILED, EXIT_OK, add_json, add_source, load, positive_int, when

if TYPE_CHECKING:
    from collector.config import Source
    from collector.deadletter import DeadLetter
    from collector.deadletter.base import DeadLetters
    from collector.frontier.base import Frontier
    from flows.cli._common import Commands

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
STAGES: tuple[str, ...] = get_args(Stage)
# What the STATUS column shows for a resolved entry, per resolution kind (see status_of).
_SHOWN_KIND = {kind: "re-enqueued" if kind == "reenqueued" else kind for kind in RESOLUTION_KINDS}
_KIND_SHOWN = {shown: kind for kind, shown in _SHOWN_KIND.items()}
# Every value the STATUS column can show is a --status filter ("resolved": every resolved kind).
STATUSES = ("open", "review", "resolved", *_SHOWN_KIND.values(), "all")
_ID_SHOWN = 12  # id characters shown in the table; any unique prefix names an entry
_PREFIX_SCAN = 1_000_000  # entries looked through to match an id prefix


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d``, ``1w`` -> seconds (argparse type)."""
    match = _AGE.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 90s, 15m, 2h, 3d or 1w")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def find_entry(store: DeadLetters, source: Source, reference: str) -> DeadLetter:
    """The entry of ``source`` whose id is ``reference`` or starts with it (like git's short
    ids); a ConfigError when none or several match."""
    reference = reference.strip().lower()
    entry = store.get(reference)
    if entry is not None and entry.source == source.name:
        return entry
    if len(reference) < 4:
        raise ConfigError(f"dead letter id {reference!r}: give at least 4 characters")
    matches = [
        e
        for e in store.list(source=source.name, status=None, limit=_PREFIX_SCAN)
        if e.id.startswith(reference)
    ]
    if not matches:
        raise ConfigError(f"no dead letter with id {reference!r} in {source.name}")
    if len(matches) > 1:
        shown = ", ".join(e.id[:_ID_SHOWN] for e in matches[:5])
        raise ConfigError(
            f"dead letter id {reference!r} is ambiguous in {source.name}: "
            f"{len(matches)} entries start with it ({shown}); give more characters"
        )
    return matches[0]


def error_filter(value: str | None) -> tuple[str | None, str | None]:
    """``--error-class`` -> (cause, error class): ``http_500`` as the table's ERROR column shows
    it, or ``retries_exhausted:http_500`` as the demo and triage label it (that cause only)."""
    if value is None:
        return None, None
    cause, sep, error_class = value.partition(":")
    if sep and cause in CAUSES and cause:
        return cause, error_class
    return None, value


def _matching(
    source: Source, store: DeadLetters, args: argparse.Namespace, status: str | None, limit: int
) -> list[DeadLetter]:
    """The entries the filters select, newest first, at most ``limit``; ``status`` is a
    ``--status`` value (a resolution kind as the table shows it: resolved entries of that kind)
    or None for all."""
    cause, error_class = error_filter(args.error_class)
    kind = _KIND_SHOWN.get(status or "")
    found = store.list(
        source=source.name,
        stage=args.stage,
        error_class=error_class,
        status=store_status(status),
        # the cause and the resolution kind are checked here, so the store's limit cannot apply
        limit=limit if cause is None and kind is None else _PREFIX_SCAN,
        first_seen_before=None if args.older_than is None else time.time() - args.older_than,
    )
    if cause is not None or kind is not None:
        found = [
            entry for entry in found
            if (cause is None or entry.cause == cause)
            and (kind is None or entry.resolution_kind == kind)
        ][:limit]  # fmt: skip
    return list(found)


def store_status(status: str | None) -> str | None:
    """The store's status for a ``--status`` value: a resolution kind is ``resolved``."""
    return "resolved" if status in _KIND_SHOWN else status


def _selected(source: Source, store: DeadLetters, args: argparse.Namespace) -> list[DeadLetter]:
    """The entries named by id, or those matching the filters (at least one is required)."""
    if args.ids:
        return [find_entry(store, source, entry_id) for entry_id in args.ids]
    if not (args.stage or args.error_class or args.older_than is not None or args.all):
        raise ConfigError("name entries by id, or select them with --stage, --error-class,"
                          " --older-than or --all")  # fmt: skip
    return _matching(source, store, args, "open", args.limit)


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
    from collector.backends import open_deadletters

    source = load(args.source, look_only=args.action in ("list", "show"))
    # list and show only read: a source never run here gets no store file made by a look
    store = open_deadletters(source, existing_only=args.action in ("list", "show"))
    try:
        if args.action == "list":
            return _list(source, store, args)
        if args.action == "show":
            entry = find_entry(store, source, args.id)
            print(json.dumps(_entry_dict(entry), indent=2, default=str))
            return EXIT_OK
        if args.action == "discard":
            return _discard(source, store, args)
        from collector.backends import open_frontier
        from flows.cli.recovery import under_source_lock

        entries = _selected(source, store, args)  # a bad selection: one line before any wait
        # The frontier opens first: one unreachable says so before a Prefect server is started
        # for the lock (and before any wait for it).
        with open_frontier(source) as frontier:
            return under_source_lock(
                source, "deadletters retry", lambda: _retry(source, store, frontier, entries)
            )
    finally:
        store.close()


def _entry_dict(entry: DeadLetter) -> dict[str, Any]:
    data: dict[str, Any] = entry.to_dict()
    data["first_seen_at"] = when(entry.first_seen)  # the epoch floats stay for scripts
    data["last_seen_at"] = when(entry.last_seen)
    return data


def _list(source: Source, store: DeadLetters, args: argparse.Namespace) -> int:
    status = None if args.status == "all" else args.status
    found = _matching(source, store, args, status, args.limit + 1)  # +1: was the list cut?
    entries, cut = found[: args.limit], len(found) > args.limit
    if args.json:
        print(json.dumps([_entry_dict(e) for e in entries], default=str))
    elif entries:
        print_table(entries)
    if cut:
        first = "the first entry" if args.limit == 1 else f"the first {args.limit} entries"
        print(f"showing {first}; more match (raise --limit)", file=sys.stderr)
    if not entries:
        _say_none(source, store, args)
    return EXIT_OK


def status_of(entry: DeadLetter) -> str:
    """The STATUS cell: open, review, or how a resolved entry was resolved (discarded,
    re-enqueued, repaired, ...), so ``--status resolved`` tells them apart."""
    if entry.status != "resolved" or not entry.resolution_kind:
        return str(entry.status)
    return _SHOWN_KIND.get(entry.resolution_kind, str(entry.resolution_kind))


def print_table(entries: list[DeadLetter]) -> None:
    """The dead-letter table (``deadletters list``, ``review --list``): one format."""
    header = ("ID", "STATUS", "STAGE", "ERROR", "FIRST SEEN (UTC)", "TRIES", "URL", "MESSAGE")
    rows = [
        (
            e.id[:_ID_SHOWN],
            status_of(e),
            e.stage,
            e.error_class,
            when(e.first_seen),
            str(e.attempts),
            e.url,
            _short(e.message),
        )
        for e in entries
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


def _short(message: str, limit: int = 100) -> str:
    flat = " ".join(message.splitlines())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _say_none(source: Source, store: DeadLetters, args: argparse.Namespace) -> None:
    """An empty list says so, and where the entries are when they are elsewhere."""
    filters = [f"status {args.status}"]
    filters += [f"{name} {value}" for name, value in
                (("stage", args.stage), ("error class", args.error_class)) if value]  # fmt: skip
    if args.older_than is not None:
        filters.append(f"older than {args.older_than:g}s")
    print(f"no dead letters of {source.name} match ({', '.join(filters)})", file=sys.stderr)
    counts = store.counts(source.name)
    kind = args.status in _KIND_SHOWN  # "none discarded": the other resolved ones are elsewhere
    elsewhere = [f"{n} {s}" for s, n in sorted(counts.items()) if n and (kind or s != args.status)]
    if elsewhere and args.status != "all":
        hint = "; ".join(
            f"--status {s}" for s, n in sorted(counts.items())
            if n and (kind or s != args.status)
        )  # fmt: skip
        print(f"the source has {', '.join(elsewhere)} (see {hint} or --status all)",
              file=sys.stderr)  # fmt: skip
    if args.error_class:
        status = None if args.status == "all" else store_status(args.status)
        known = sorted({_class_of(r) for r in store.reasons(source.name, status=status)})
        if known:
            print(f"error classes of {args.status} entries: {', '.join(known)}", file=sys.stderr)


def _class_of(reason: str) -> str:
    """``fetch/retries_exhausted:http_500`` (a reason label) -> ``http_500``."""
    label = reason.split("/", 1)[-1]
    cause, sep, error_class = label.partition(":")
    return error_class if sep and cause in CAUSES else label


def _discard(source: Source, store: DeadLetters, args: argparse.Namespace) -> int:
    entries = _selected(source, store, args)
    reason = _discard_reason(args)
    if reason is None:
        raise ConfigError("discard needs a reason (--reason TEXT, or answer the prompt)")
    done = sum(store.resolve(e.id, "discarded", reason) for e in entries)
    closed = len(entries) - done
    note = f" ({closed} {'was' if closed == 1 else 'were'} not open)" if closed else ""
    print(f"discarded {done} of {_letters(len(entries))}{note}")
    return EXIT_OK


def _retry(
    source: Source, store: DeadLetters, frontier: Frontier, entries: list[DeadLetter]
) -> int:
    """Fetch the entries' pages again: back to the frontier's queue if dead (or expired),
    whatever the entry's status (a repaired entry's page may still be dead); each entry not
    resolved yet is resolved once, through the same engine code as triage's re-enqueue
    (:mod:`collector.recovery.requeue`). Exit 1 when a page was not dead, so nothing was done.
    Called under the source's lock (``under_source_lock``): a run in progress counts dead
    pages in its account."""
    from collector.recovery.requeue import reenqueue

    requeued = refused = 0
    queued_urls: set[str] = set()
    for entry in entries:
        if entry.url in queued_urls:  # a page named by several entries: queued once
            if entry.status != "resolved":
                store.resolve(entry.id, "reenqueued", "operator retry", requeued=True)
            requeued += 1
            continue
        if not reenqueue(store, frontier, source, entry, detail="operator retry",
                         now=time.time()):  # fmt: skip
            refused += 1
            print(_not_requeued(entry), file=sys.stderr)
            continue
        queued_urls.add(entry.url)
        requeued += 1
    if requeued:
        print(f"re-enqueued {requeued} of {_letters(len(entries))}; the next run fetches them")
    else:
        print(f"re-enqueued none of {_letters(len(entries))}: nothing to fetch again")
    return EXIT_OK if not refused else EXIT_FAILED


def _not_requeued(entry: DeadLetter) -> str:
    """Why an entry's page was not queued again: the frontier does not hold it dead."""
    if entry.status == "resolved":
        kind = (entry.resolution_kind or "resolved").replace("reenqueued", "re-enqueued")
        return (
            f"{entry.id[:_ID_SHOWN]}: resolved already ({kind}); its page {entry.url} is not "
            "dead or expired in the frontier (queued, or stored since): nothing to re-enqueue"
        )
    return (
        f"{entry.id[:_ID_SHOWN]}: the frontier does not hold {entry.url} as dead or expired; "
        "not re-enqueued"
    )


def _letters(count: int) -> str:
    return f"{count} dead letter{'s' * (count != 1)}"


def register(commands: Commands) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    letters = commands.add_parser("deadletters", help="inspect, retry or discard dead letters")
    letter_actions = letters.add_subparsers(dest="action", required=True, metavar="ACTION")

    def filters(p: argparse.ArgumentParser, limit: int) -> None:
        p.add_argument("--stage", default=None, choices=STAGES,
                       help="only entries that failed at this stage")  # fmt: skip
        p.add_argument(
            "--error-class", default=None, metavar="CLASS",
            help="only entries of this error class (e.g. http_404, timeout), or of this"
            " cause and class (e.g. retries_exhausted:http_500)",
        )  # fmt: skip
        p.add_argument(
            "--older-than", type=parse_age, default=None, metavar="AGE",
            help="first seen longer ago than AGE (90s, 15m, 2h, 3d, 1w)",
        )  # fmt: skip
        p.add_argument("--limit", type=positive_int, default=limit, metavar="N",
                       help=f"at most N entries (default {limit})")  # fmt: skip

    listing = letter_actions.add_parser(
        "list", help="a table of dead letters (open ones unless --status says otherwise)"
    )
    add_source(listing)
    filters(listing, 100)
    listing.add_argument(
        "--status", default="open", choices=STATUSES,
        help="open (default), review (escalated by triage), resolved (every resolved entry),"
        " one way of resolving as the STATUS column shows it"
        f" ({', '.join(_SHOWN_KIND.values())}), or all",
    )  # fmt: skip
    add_json(listing, "the entries")
    show = letter_actions.add_parser("show", help="every field of one dead letter, as JSON")
    add_source(show)
    show.add_argument("id", metavar="ID", help="the entry's id, or a unique prefix of it")
    for name, helptext in (
        ("retry", "re-queue the entries' URLs in the frontier (the next run fetches them)"),
        ("discard", "resolve entries as discarded, with a reason that is kept"),
    ):
        act = letter_actions.add_parser(name, help=helptext)
        add_source(act)
        act.add_argument("ids", nargs="*", metavar="ID", help="entry ids, or unique prefixes")
        filters(act, 10_000)
        act.add_argument("--all", action="store_true", help="every open entry of the source")
        if name == "discard":
            act.add_argument(
                "--reason", default=None,
                help="why, kept with each entry (asked for on a terminal)",
            )  # fmt: skip
    letters.set_defaults(func=cmd_deadletters)
