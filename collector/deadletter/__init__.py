"""Dead-letter stores: the protocol, the SQLite store and its JSONL archive, the Redis store.

The Redis store is imported on first use (``collector.deadletter.redis``) so that the embedded
default never imports the redis client.
"""

from collector.deadletter.base import DeadLetter, DeadLetterStore, dead_letter_id
from collector.deadletter.sqlite import JsonlArchive, SqliteDeadLetterStore

__all__ = [
    "DeadLetter",
    "DeadLetterStore",
    "JsonlArchive",
    "SqliteDeadLetterStore",
    "dead_letter_id",
]
