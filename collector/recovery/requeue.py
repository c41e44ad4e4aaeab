"""Re-enqueue a dead letter: its URL back in the frontier's queue, the entry resolved once.

The one code path for both ways a dead URL is fetched again: triage's automatic re-enqueue of a
recoverable failure and an operator's ``collector deadletters retry``. The frontier is changed
first; the entry is resolved only when the frontier took the URL back, so a failure between the
two leaves the entry open (retried again later) rather than closed with nothing queued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.config import Source
    from collector.deadletter.base import DeadLetter, DeadLetterStore
    from collector.frontier.base import Frontier

__all__ = ["reenqueue"]


def reenqueue(
    store: DeadLetterStore,
    frontier: Frontier,
    source: Source,
    entry: DeadLetter,
    *,
    detail: str,
    now: float,
) -> bool:
    """Queue ``entry``'s URL again and, unless it is resolved already (a repaired entry whose
    page is still dead), resolve the entry as ``reenqueued`` with ``detail``.

    False when the frontier does not hold the URL as dead or expired (nothing was changed).
    """
    if not frontier.requeue(source.name, [entry.url], now=now, queue_ttl_s=source.ttl.queue_ttl_s):
        return False
    if entry.status != "resolved":
        store.resolve(entry.id, "reenqueued", detail, requeued=True)
    return True
