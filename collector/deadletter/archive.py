"""The append-only JSONL history of a dead-letter store, and what the triage balance reads from it.

Every store writes one line per ``put`` entry (``quarantined``), per escalation and per
resolution; lines are never rewritten, files are rotated by size and never touched again. The
history is kept apart from the store on purpose: it is the independent count of the balance
(:func:`collector.recovery.triage.tally`). The store can lose, duplicate or rewrite an entry (a
Redis without persistence restarted, a bad migration, two stores pointed at different
databases) without the archive noticing, and the archive can be read without the store.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from collector import _json, defaults

__all__ = ["JsonlArchive", "dumps"]


def dumps(value: Any) -> bytes:
    """JSON bytes through the one codec (collector._json: exact for big integers)."""
    return _json.dumps(value)


class JsonlArchive:
    """Append-only JSONL history of dead letters, rotated by size.

    A write that would take the file past ``max_bytes`` first moves the file aside to the next
    ``<stem>.NNNNN<suffix>`` (numbers only grow, so the rotated files sort oldest first); one
    write is never split across files, so a single event larger than ``max_bytes`` still lands
    whole in a file of its own.
    """

    def __init__(self, path: str | Path, *, max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES):
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.path = Path(path)  # its folder is made by the first append: readers make nothing
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def rotated(self) -> builtins.list[Path]:
        """The rotated files, oldest first (the live file is :attr:`path`)."""
        found = []
        for candidate in self.path.parent.glob(f"{self.path.stem}.*{self.path.suffix}"):
            middle = candidate.name[
                len(self.path.stem) + 1 : len(candidate.name) - len(self.path.suffix)
            ]
            if middle.isdigit():
                found.append((int(middle), candidate))
        return [path for _, path in sorted(found)]

    def files(self) -> builtins.list[Path]:
        """Every archive file, oldest first."""
        return [*self.rotated(), *([self.path] if self.path.exists() else [])]

    def _rotate(self) -> None:
        existing = self.rotated()
        number = 1
        if existing:
            last = existing[-1].name[len(self.path.stem) + 1 :].split(".")[0]
            number = int(last) + 1
        target = self.path.with_name(f"{self.path.stem}.{number:05d}{self.path.suffix}")
        os.replace(self.path, target)

    def append(self, event: str, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        now = time.time()
        data = b"".join(dumps({"event": event, "at": now, **row}) + b"\n" for row in rows)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.max_bytes:
                self._rotate()
            with self.path.open("ab") as handle:
                handle.write(data)

    def events(self) -> Iterator[dict[str, Any]]:
        """Every event of every file, oldest first (a torn last line is skipped)."""
        for path in self.files():
            try:
                handle = path.open("rb")
            except FileNotFoundError:  # rotated away between listing and opening
                continue
            with handle:
                for line in handle:
                    if not line.endswith(b"\n"):
                        break  # a write in progress, or cut by a crash: not an event yet
                    yield _json.loads(line)

    def quarantined_ids(self, source: str) -> set[str]:
        """The ids of every entry of ``source`` ever quarantined (put) through this archive."""
        found: set[str] = set()
        for event in self.events():
            if event.get("event") == "quarantined" and event.get("source") == source:
                found.add(event["id"])
        return found
