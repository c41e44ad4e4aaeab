"""Dead-letter stores: the protocols, the SQLite store, the JSONL archive, the Redis store.

The Redis store is imported on first use (``collector.deadletter.redis``) so that the embedded
default never imports the redis client.
"""

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
