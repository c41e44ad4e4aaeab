"""Dead letters: items that failed, kept with everything needed to understand and resolve them.

An entry's ``id`` is derived from (source, url, stage, error class, record key), so the same
failure seen again (a rerun, a replay) updates one entry (``attempts``, ``last_seen``) instead of
adding a second: every dead letter exists once and is resolved once. Payloads are scrubbed of
secrets before they are stored. Every backend passes ``tests/deadletter/conformance.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["DeadLetter", "DeadLetterStore", "Stage", "dead_letter_id"]

Stage = Literal["plan", "fetch", "parse", "validate", "store"]
Status = Literal["open", "review", "resolved"]


def dead_letter_id(source: str, url: str, stage: str, error_class: str, key: str = "") -> str:
    raw = "\x1f".join((source, url, stage, error_class.split(":")[-1], key))
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


@dataclass(slots=True)
class DeadLetter:
    source: str
    url: str
    stage: Stage
    error_class: str
    message: str
    attempts: int
    first_seen: float
    last_seen: float
    record_key: str = ""
    payload: Any = None  # the record or a body excerpt, scrubbed
    failed_expectations: list[dict[str, Any]] = field(default_factory=list)
    flow_run_id: str | None = None
    status: Status = "open"
    resolution: str | None = None
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = dead_letter_id(
                self.source, self.url, self.stage, self.error_class, self.record_key
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class DeadLetterStore(Protocol):
    def put(self, entries: Sequence[DeadLetter]) -> int:
        """Store entries (upsert by id); returns how many ids were new."""
        ...

    def get(self, entry_id: str) -> DeadLetter | None: ...

    def list(
        self,
        *,
        source: str | None = None,
        stage: str | None = None,
        error_class: str | None = None,
        status: str | None = "open",
        limit: int = 100,
    ) -> list[DeadLetter]: ...

    def counts(self, source: str | None = None) -> dict[str, int]:
        """Entries per status (open, review, resolved)."""
        ...

    def reasons(self, source: str, *, status: str | None = "open") -> dict[str, int]:
        """Open entries per ``stage/error_class``."""
        ...

    def resolve(self, entry_id: str, resolution: str) -> bool:
        """Mark an open entry resolved; False if it was not open (resolve happens once)."""
        ...

    def close(self) -> None: ...
