"""Frontier backends: the protocol, and the embedded SQLite implementation."""

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
