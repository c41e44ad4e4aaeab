"""Claim loop run in threads and in spawned processes by test_sqlite_frontier.py.

Kept apart from the test modules so a spawned child imports only this and collector.
"""

from __future__ import annotations

from typing import Any

from collector.frontier.base import Completed
from collector.frontier.sqlite import SqliteFrontier

SOURCE = "src"
NOW = 1_700_000_000.0


def claim_until_empty(path: str, barrier: Any, limit: int) -> list[tuple[int, list[str]]]:
    """Claim (and ack every other lease) until a claim comes back empty.

    Returns ``[(token, urls), ...]`` in the order the claims were made.
    """
    frontier = SqliteFrontier(path)
    try:
        barrier.wait()
        claims: list[tuple[int, list[str]]] = []
        while True:
            lease = frontier.claim(SOURCE, limit, now=NOW, lease_s=1e6)
            if not lease.items:
                claims.append((lease.token, []))
                return claims
            urls = [item.url for item in lease.items]
            claims.append((lease.token, urls))
            if len(claims) % 2:
                outcomes = [Completed(u, fresh_until=NOW + 1e6, fetched_at=NOW) for u in urls]
                result = frontier.ack(lease, outcomes, now=NOW)
                assert result.accepted == len(urls), result
    finally:
        frontier.close()


def process_main(path: str, barrier: Any, queue: Any, name: str, limit: int) -> None:
    try:
        queue.put((name, claim_until_empty(path, barrier, limit)))
    except BaseException as exc:  # report, so the parent does not wait forever
        queue.put((name, repr(exc)))
        raise
