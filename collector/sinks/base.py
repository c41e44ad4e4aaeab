"""Where records go. A sink is an idempotent upsert keyed by record key, guarded by fencing.

For each record the sink compares the fencing token of the write with the token stored for the
key: an *older* token is refused (counted in ``stale``), so a worker that paused past its lease
cannot overwrite what the item's new holder wrote; the *same content* again is a no-op
(``unchanged``), which makes a replay or a rerun after a crash write nothing twice.
Every backend passes ``tests/sinks/conformance.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["BatchSummary", "Sink", "SinkRecord", "WriteResult"]


@dataclass(frozen=True, slots=True)
class SinkRecord:
    key: str
    record: dict[str, Any]
    url: str


@dataclass(slots=True)
class WriteResult:
    written: int = 0  # new keys, or new content under a token at least as new
    unchanged: int = 0  # same content already stored: nothing written
    stale: int = 0  # refused: the stored token is newer than this write's
    stale_keys: list[str] = field(default_factory=list)
    # the pages (record URLs) with a record written: new content; a page of the batch not here
    # had all its records unchanged (what a learned revisit schedule counts as "not changed")
    written_urls: set[str] = field(default_factory=set, compare=False)


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """One batch the sink holds records of: what ``collector batches`` lists.

    ``written_at`` is when the batch last stored a record it still holds (epoch seconds; every
    sink keeps a stored time per record, so no layout change was needed); ``None`` for records
    written before the sink kept one.
    """

    batch_id: str
    records: int
    written_at: float | None


@runtime_checkable
class Sink(Protocol):
    def write(self, records: Sequence[SinkRecord], *, token: int, batch_id: str) -> WriteResult:
        """Upsert ``records`` durably (on return they survive a crash)."""
        ...

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored record for ``key``, or None."""
        ...

    def count(self) -> int:
        """Number of distinct keys stored."""
        ...

    def remove_batch(self, batch_id: str) -> int:
        """Undo the writes of one batch (compensation); returns how many records went."""
        ...

    def batches(self) -> list[str]:
        """The ids of the batches that hold at least one stored record, sorted.

        A batch holds a key while the key's current version is the one it wrote, exactly the
        records ``remove_batch`` would remove (so an audit can read what it would undo).
        """
        ...

    def batch_summaries(self) -> list[BatchSummary]:
        """:meth:`batches` with the records each holds and when it wrote them, in the same
        order, without reading the records themselves."""
        ...

    def records(self, batch_id: str) -> list[SinkRecord]:
        """The stored records that batch ``batch_id`` holds, with their keys and page URLs,
        sorted by key (``[]`` if none)."""
        ...

    def location(self) -> str:
        """Where records are, for summaries (a folder, a table)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None: ...
