"""Dead-letter stores: the protocols, the SQLite store, the JSONL archive, the Redis store.

The Redis store is imported on first use (``collector.deadletter.redis``) so that the embedded
default never imports the redis client.
"""

from __future__ import annotations

import typing

from collector import _lazy

if typing.TYPE_CHECKING:
    from collector.deadletter.archive import JsonlArchive
    from collector.deadletter.base import (
        Census,
        DeadLetter,
        DeadLetters,
        DeadLetterStore,
        ReviewQueue,
        TriageClaims,
        dead_letter_id,
    )
    from collector.deadletter.sqlite import SqliteDeadLetterStore

# Each name is imported on first use (collector/_lazy.py), so a caller that needs one module
# of this package does not pay for the others.
_HOMES = {
    "Census": "collector.deadletter.base",
    "DeadLetter": "collector.deadletter.base",
    "DeadLetterStore": "collector.deadletter.base",
    "DeadLetters": "collector.deadletter.base",
    "JsonlArchive": "collector.deadletter.archive",
    "ReviewQueue": "collector.deadletter.base",
    "SqliteDeadLetterStore": "collector.deadletter.sqlite",
    "TriageClaims": "collector.deadletter.base",
    "dead_letter_id": "collector.deadletter.base",
}
__getattr__, __dir__ = _lazy.lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "Census",
    "DeadLetter",
    "DeadLetterStore",
    "DeadLetters",
    "JsonlArchive",
    "ReviewQueue",
    "SqliteDeadLetterStore",
    "TriageClaims",
    "dead_letter_id",
]
