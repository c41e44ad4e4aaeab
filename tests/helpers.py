"""Small helpers for tests that write sources and read sinks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from prefect.client.schemas.objects import State  # for the type only: Prefect imports slowly


def write_source(folder: Path, **sections: Any) -> Path:
    """Write a source YAML into ``folder`` with sensible test defaults, overridden by sections."""
    source: dict[str, Any] = {
        "name": "test-items",
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
        "ttl": {
            "http_timeout_s": 2,
            "request_deadline_s": 3,
            "batch_timeout_s": 30,
            "lease_s": 60,
        },
        "retry": {"base_s": 0.05, "cap_s": 0.2, "max_attempts": 3},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(source.get(key), dict):
            source[key] = {**source[key], **value}
        else:
            source[key] = value
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(source, sort_keys=False), encoding="utf-8")
    return path


def sink_lines(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for file in sorted(folder.glob("*.jsonl")):
        with file.open(encoding="utf-8") as lines:
            rows.extend(json.loads(line) for line in lines if line.strip())
    return rows


def complete_lines(folder: Path) -> int:
    """How many whole records the JSONL sink holds so far, read while a run writes: a line
    still being written (no line break yet) is not counted, nor parsed."""
    return sum(file.read_bytes().count(b"\n") for file in folder.glob("*.jsonl"))


def duplicate_keys(rows: list[dict[str, Any]]) -> list[str]:
    counts = Counter(str(row["_collector"]["key"]) for row in rows)
    return [key for key, n in counts.items() if n > 1]


def summary_of(result: dict[str, Any] | State[Any]) -> dict[str, Any]:
    """The summary dict a call of the ``collect`` flow returned, typed as such.

    Prefect types a flow call as its function's return annotation, and ``collect`` is annotated
    ``dict | State`` because an interrupted run returns a ``Cancelled`` state. But a call without
    ``return_state=True`` never hands a State back (Prefect returns the state's data, or raises
    for a cancelled or failed one), so this assertion only narrows the type.
    """
    assert isinstance(result, dict), f"collect returned {result!r}, not a summary"
    return result
