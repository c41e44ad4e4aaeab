"""Collector: data-collection pipelines with TTLs, a priority frontier, leases and dead letters.

The engine is plain Python and never imports Prefect, the flows or the blocks; ``flows/`` runs it
as Prefect flows. The public surface is re-exported here; everything else is internal.
"""

from __future__ import annotations

from collector.config import Source, SourceError, load_source, source_json_schema
from collector.deadletter import DeadLetter, DeadLetterStore, SqliteDeadLetterStore
from collector.errors import (
    BackendError,
    CollectorError,
    ConfigError,
    ConservationError,
    FetchError,
    PermanentFetchError,
    RecoverableFetchError,
)
from collector.fetch.engine import FetchEngine, FetchResult
from collector.frontier import Frontier, Lease, SqliteFrontier
from collector.run.collection import BatchReport, Collection
from collector.run.ledger import Ledger
from collector.run.locks import SourceBusy
from collector.sinks import JsonlSink, Sink, SinkRecord

__all__ = [
    "BackendError",
    "BatchReport",
    "Collection",
    "CollectorError",
    "ConfigError",
    "ConservationError",
    "DeadLetter",
    "DeadLetterStore",
    "FetchEngine",
    "FetchError",
    "FetchResult",
    "Frontier",
    "JsonlSink",
    "Lease",
    "Ledger",
    "PermanentFetchError",
    "RecoverableFetchError",
    "Sink",
    "SinkRecord",
    "Source",
    "SourceBusy",
    "SourceError",
    "SqliteDeadLetterStore",
    "SqliteFrontier",
    "load_source",
    "source_json_schema",
]

__version__ = "0.1.0"
