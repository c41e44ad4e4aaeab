"""Frontier backends: the protocol, and the embedded SQLite implementation."""

from __future__ import annotations

import typing

from collector import _lazy

if typing.TYPE_CHECKING:
    from collector.frontier.base import (
        AckResult,
        ClaimedItem,
        Completed,
        DeadLettered,
        Frontier,
        Lease,
        Offer,
        OfferResult,
        Outcome,
        RetryLater,
        StateCounts,
        SweepResult,
    )
    from collector.frontier.sqlite import SqliteFrontier

# Each name is imported on first use (collector/_lazy.py), so a caller that needs one module
# of this package does not pay for the others.
_HOMES = {
    "AckResult": "collector.frontier.base",
    "ClaimedItem": "collector.frontier.base",
    "Completed": "collector.frontier.base",
    "DeadLettered": "collector.frontier.base",
    "Frontier": "collector.frontier.base",
    "Lease": "collector.frontier.base",
    "Offer": "collector.frontier.base",
    "OfferResult": "collector.frontier.base",
    "Outcome": "collector.frontier.base",
    "RetryLater": "collector.frontier.base",
    "SqliteFrontier": "collector.frontier.sqlite",
    "StateCounts": "collector.frontier.base",
    "SweepResult": "collector.frontier.base",
}
__getattr__, __dir__ = _lazy.lazy_exports(__name__, _HOMES, globals())

__all__ = [
    "AckResult",
    "ClaimedItem",
    "Completed",
    "DeadLettered",
    "Frontier",
    "Lease",
    "Offer",
    "OfferResult",
    "Outcome",
    "RetryLater",
    "SqliteFrontier",
    "StateCounts",
    "SweepResult",
]
