"""``collector status SOURCE...``: where a source's items are now, without running anything.

Reads the source's own stores (no Prefect): the frontier's items per state and who holds
leases, whether the next run plans the seed list in full or only what is due, the dead letters
per status and reason, and the sink's record count. What an operator looks at before a rerun,
after a crash, or when a scheduled run "did nothing".

A holder of leased items is judged by its heartbeat in the frontier, as every run judges the
others (:mod:`collector.run.heartbeat`): silent for ``HOLDER_DEAD_AFTER_S``, it is presumed dead
and the next run revokes its leases at once (its items go back to the queue, none lost or done
twice). A run's pid lives with its source lock in Prefect, which status does not ask; so a
holder killed a moment ago reads as alive until its heartbeat is that old, and the line says
when it stops counting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

from collector import defaults
from collector.errors import BackendError
from flows.cli._common import EXIT_OK, add_json, add_source, in_source, load

if TYPE_CHECKING:
    from collector.config import Source
    from flows.cli._common import Commands


def source_status(reference: str, source: Source | None = None) -> dict[str, Any]:
    """The status of one source, as plain data (what ``--json`` prints); ``source``: already
    loaded from ``reference``."""
    from collector.backends import open_backends
    from flows.cli._sink_hints import sink_folder, sink_hints

    if source is None:
        source = load(reference, look_only=True)
    folder = sink_folder(source)
    existed = folder is None or folder.is_dir()  # before the stores, which may make it
    now = time.time()
    dead_after_s = defaults.HOLDER_DEAD_AFTER_S
    # beside a run: no writer lock; a source never run here: no store files made by a look
    with open_backends(source, readonly_sink=True, existing_only=True) as stores:
        counts = stores.frontier.counts(source.name)
        ran_here = getattr(stores.frontier, "existed", True)  # False: no SQLite file yet
        holders = [
            {
                "holder": held.holder,
                "leased": held.leased,
                "beat_s_ago": None if held.beat_at is None else round(now - held.beat_at, 1),
                # what the next run will judge (judge_holders): silent too long, its leases are
                # revoked; a holder that never beat is left to its leases' end
                "presumed_dead": held.beat_at is not None and now - held.beat_at > dead_after_s,
                "dead_after_s": dead_after_s,
            }
            for held in stores.frontier.holders(source.name)
        ]
        unchanged = stores.frontier.plan_mark(source.name) == source.seed_mark()
        notes = sink_hints(source, folder, existed=existed, done=counts.done, total=counts.total)
        return {
            "source": source.name,
            "items": {**dataclasses.asdict(counts), "total": counts.total},
            "holders": holders,
            "next_plan": "incremental" if unchanged else "full",
            "deadletters": stores.deadletters.counts(source.name),
            "deadletter_reasons": stores.deadletters.reasons(source.name),
            "records_in_sink": stores.sink.count(),
            "frontier": stores.frontier.location(),
            "deadletter_store": stores.deadletters.location(),
            "sink": stores.sink.location(),
            "ran_here": ran_here,
            "notes": notes,
        }


def _print(reference: str, status: dict[str, Any]) -> None:
    items = status["items"]
    states = ("queued", "leased", "done", "dead", "expired", "retired")
    if not status.get("ran_here", True):
        print(f"{reference} ({status['source']}): not run here yet (no {status['frontier']})")
    else:
        print(f"{reference} ({status['source']}): {items['total']} items in {status['frontier']}")
    print("  " + "  ".join(f"{state} {items[state]}" for state in states))
    for held in status["holders"]:
        print(f"  held by {held['holder']}: {held['leased']} leased ({holder_liveness(held)})")
    print(
        "  next run plans "
        + (
            "only what is due (the seed list is unchanged since the last plan)"
            if status["next_plan"] == "incremental"
            else "the seed list in full (new, edited, or the last plan was cut short)"
        )
    )
    dead = status["deadletters"]
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(status["deadletter_reasons"].items()))
    print(
        "  dead letters: "
        + ", ".join(f"{state} {dead.get(state, 0)}" for state in ("open", "review", "resolved"))
        + (f" (open: {reasons})" if reasons else "")
    )
    print(f"  sink: {status['records_in_sink']} records in {status['sink']}")
    for note in status.get("notes", []):
        print(f"  note: {note}")


def holder_liveness(held: dict[str, Any]) -> str:
    """What a holder's heartbeat says, and what becomes of its items (one holder of --json)."""
    beat, dead_after_s = held["beat_s_ago"], held["dead_after_s"]
    if beat is None:
        return "no heartbeat: its items come back when their lease ends"
    if held["presumed_dead"]:
        return f"silent {beat:g}s: presumed dead, the next run takes its items back"
    return (
        f"last heartbeat {beat:g}s ago; its items are taken back if it stays silent "
        f"{dead_after_s:g}s"
    )


def cmd_status(args: argparse.Namespace) -> int:
    # every source readable before any store is opened (else exit 2, main)
    loaded = {reference: load(reference, look_only=True) for reference in args.sources}
    found = {}
    for reference in args.sources:
        try:
            found[reference] = source_status(reference, loaded[reference])
        except BackendError as exc:  # which of several sources: its file in front (main prints)
            raise BackendError(in_source(reference, str(exc))) from exc
    if args.json:
        print(json.dumps(list(found.values())))
        return EXIT_OK
    for reference, status in found.items():
        _print(reference, status)
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``status`` to ``collector``'s parser."""
    status = commands.add_parser(
        "status", help="where a source's items are now: frontier, dead letters, sink (no run)"
    )
    add_source(status, many=True)
    add_json(status, "one object per source")
    status.set_defaults(func=cmd_status)
