"""Sink backends: the protocol and the JSONL default."""

from collector.sinks.base import Sink, SinkRecord, WriteResult
from collector.sinks.jsonl import JsonlSink

__all__ = ["JsonlSink", "Sink", "SinkRecord", "WriteResult"]
