"""How every sink turns a record into bytes and a content hash (the same for all backends).

Shared so that "unchanged" means the same thing whichever sink stores the record: the hash is
taken over the record serialised with sorted keys, so key order never makes a record "new". The
bytes are :mod:`collector._json`'s, whose reader gives back exactly what was written, so a record
read back from any sink hashes as it did when it was written.
"""

from __future__ import annotations

import hashlib
from typing import Any

from collector import _json

__all__ = ["digest", "dumps"]


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """The JSON every sink stores (:func:`collector._json.dumps`)."""
    return _json.dumps(value, sort_keys=sort_keys)


def digest(record: dict[str, Any]) -> bytes:
    """16-byte content hash of a record, independent of key order."""
    return hashlib.blake2b(_json.dumps(record, sort_keys=True), digest_size=16).digest()
