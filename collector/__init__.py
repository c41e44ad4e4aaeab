"""Collector: data-collection pipelines with TTLs, a priority frontier, leases and dead letters.

The engine is plain Python and never imports Prefect, the flows or the blocks; ``flows/`` runs it
as Prefect flows. The public surface is re-exported here, each name imported on first use (so
``import collector.errors`` stays cheap); everything else is internal.
"""

from __future__ import annotations

import typing

from collector import _lazy

if typing.TYPE_CHECKING:
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
    from collector.run.collection import BatchReport, Collection, Run
    from collector.run.ledger import Ledger
    from collector.run.locks import SourceBusy
    from collector.sinks import JsonlSink, Sink, SinkRecord

_HOMES = {
    "BackendError": "collector.errors",
    "BatchReport": "collector.run.collection",
    "Collection": "collector.run.collection",
    "CollectorError": "collector.errors",
    "ConfigError": "collector.errors",
    "ConservationError": "collector.errors",
    "DeadLetter": "collector.deadletter",
    "DeadLetterStore": "collector.deadletter",
    "FetchEngine": "collector.fetch.engine",
    "FetchError": "collector.errors",
    "FetchResult": "collector.fetch.engine",
    "Frontier": "collector.frontier",
    "JsonlSink": "collector.sinks",
    "Lease": "collector.frontier",
    "Ledger": "collector.run.ledger",
    "PermanentFetchError": "collector.errors",
    "RecoverableFetchError": "collector.errors",
    "Run": "collector.run.collection",
    "Sink": "collector.sinks",
    "SinkRecord": "collector.sinks",
    "Source": "collector.config",
    "SourceBusy": "collector.run.locks",
    "SourceError": "collector.config.problems",
    "SqliteDeadLetterStore": "collector.deadletter",
    "SqliteFrontier": "collector.frontier",
    "load_source": "collector.config",
    "source_json_schema": "collector.config",
}
__getattr__, __dir__ = _lazy.lazy_exports(__name__, _HOMES, globals())

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
    "Run",
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
