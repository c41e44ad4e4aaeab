"""What a JSONL sink folder says about records the frontier thinks were stored.

Two slips a new user made between runs, both silent before: the sink folder deleted (or
``sink.path`` changed) while the frontier still holds its pages done and fresh, so the next run
fetches none of them again and the records are simply gone; and the source renamed, so the
frontier and the dead letters start empty under the new name (keyed by it) and the run fetches
every page again into a second set of files beside the old one (each record twice in the
folder). Neither is an error (a folder may be emptied on purpose, a source renamed to start
over), so ``status`` and ``run`` say it as a note or a warning, one line, and change nothing.

Only a JSONL sink: its folder and file names are the evidence. A Postgres sink keeps records in
a table another source may share; nothing there says which records should exist.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.config import Source

_SEGMENT = re.compile(r"^(?P<name>.+)-\d{5}\.jsonl$")


def sink_folder(source: Source) -> Path | None:
    """The JSONL sink's folder (None for another sink); read before the stores are opened,
    which may make it."""
    return Path(source.sink_path) if source.sink.type == "jsonl" else None


def sink_hints(
    source: Source, folder: Path | None, *, existed: bool, done: int, total: int
) -> list[str]:
    """The notes for ``source``: ``existed`` whether ``folder`` existed before any store was
    opened, ``done`` and ``total`` the source's pages done and in all in its frontier."""
    if folder is None:
        return []
    if not existed:
        if done == 0:
            return []
        return [
            f"sink folder {folder} does not exist, yet {done} pages are done in the frontier: "
            "their records went with it (deleted or moved? sink.path changed?), and runs fetch "
            "those pages again only as they go stale"
        ]
    if total:
        return []
    writers = {m["name"] for name in _listing(folder) if (m := _SEGMENT.match(name))}
    if not writers or source.name in writers:
        return []
    # Sources side by side share a folder's `out` (init's default): a writer some source file
    # beside this one still names is that source, not this one's old name.
    others = sorted(writers - _names_declared_beside(Path(source.base_dir)))
    if not others:
        return []
    names = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return [
        f"{folder} holds records of {names} but none of {source.name}, whose frontier is "
        "empty: if the source was renamed, its items, dead letters and records stay under the "
        f"old name, and a run fetches every page again into {source.name}-*.jsonl beside them"
    ]


_NAME_LINE = re.compile(rb"""^name:[ \t]*["']?([A-Za-z0-9_.-]+)""", re.MULTILINE)
_NAME_KEY = re.compile(rb'"name"[ \t]*:[ \t]*"([A-Za-z0-9_.-]+)"')


def _names_declared_beside(folder: Path) -> set[str]:
    """The ``name:`` of the source files in ``folder`` (the first 64 KiB of each, no YAML
    parse: a look, not a load; a file that cannot be read names nothing)."""
    names: set[str] = set()
    for entry in _listing(folder):
        if not entry.endswith((".yaml", ".yml", ".json")) or entry.endswith(".suite.json"):
            continue
        try:
            with (folder / entry).open("rb") as handle:
                head = handle.read(65536)
        except OSError:
            continue
        found = (_NAME_KEY if entry.endswith(".json") else _NAME_LINE).search(head)
        if found:
            names.add(found[1].decode())
    return names


def _listing(folder: Path) -> list[str]:
    try:
        return [p.name for p in folder.iterdir()]
    except OSError:
        return []
