"""Sink backends: the protocol and the JSONL default."""

from __future__ import annotations

import typing

from collector import _lazy

if typing.TYPE_CHECKING:
    from collector.sinks.base import Sink, SinkRecord, WriteResult
    from collector.sinks.jsonl import JsonlSink

# Each name is imported on first use (collector/_lazy.py), so a caller that needs one module
# of this package does not pay for the others.
_HOMES = {
    "JsonlSink": "collector.sinks.jsonl",
    "Sink": "collector.sinks.base",
    "SinkRecord": "collector.sinks.base",
    "WriteResult": "collector.sinks.base",
}
__getattr__, __dir__ = _lazy.lazy_exports(__name__, _HOMES, globals())

__all__ = ["JsonlSink", "Sink", "SinkRecord", "WriteResult"]
