"""How every sink turns a record into bytes and a content hash (the same for all backends).

Shared so that "unchanged" means the same thing whichever sink stores the record: the hash is
taken over the record serialised with sorted keys, so key order never makes a record "new".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

__all__ = ["digest", "dumps"]


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """orjson, falling back to the stdlib for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except orjson.JSONEncodeError:
        return json.dumps(value, sort_keys=sort_keys, default=str, separators=(",", ":")).encode()


def digest(record: dict[str, Any]) -> bytes:
    """16-byte content hash of a record, independent of key order."""
    return hashlib.blake2b(dumps(record, sort_keys=True), digest_size=16).digest()
