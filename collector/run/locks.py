"""Engine-side pieces of the cross-worker locks (names and per-batch slot plans).

The locks themselves are Prefect global concurrency limits, taken by the flow (``flows/_locks.py``);
this module only says *what* to take, so the engine stays free of Prefect:

- ``source:<name>`` (limit 1): held by a ``run`` from plan to account, so two runs of one source
  never overlap. Drain-only workers (``work``) do not take it: they only help drain the frontier.
- ``domain:<host>``: per batch, as many slots as the batch will use on that host (its items there,
  at most ``per_domain_concurrency``), so a per-host concurrency is shared by every worker. The
  engine then uses at most the granted slots for that host in that batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from collector.errors import CollectorError

__all__ = ["SourceBusy", "domain_lock_name", "host_slots", "source_lock_name"]


class SourceBusy(CollectorError):
    """Another run holds ``source:<name>`` and did not let go within the wait."""


def source_lock_name(source: str) -> str:
    return f"source:{source}"


def domain_lock_name(host: str) -> str:
    return f"domain:{host}"


def host_slots(hosts: Iterable[str], per_domain_concurrency: int) -> dict[str, int]:
    """Slots a batch will use per host: its items on that host, at most the per-host cap."""
    return {
        host: min(count, per_domain_concurrency) for host, count in sorted(Counter(hosts).items())
    }
