"""Small helpers for tests that write sources, read sinks and set up a source lock."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from prefect.client.schemas.objects import State  # for the type only: Prefect imports slowly

    from collector.fetch.engine import FetchResult
    from collector.frontier import Lease
    from collector.run.collection import Collection


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test stops with SIGINT: default SIGINT, as a terminal's
    foreground job has. Run as a background job of a shell without job control (as CI may run
    the suite), the test process and its children start with SIGINT ignored, and a Python
    process keeps it so: the child would never see the Ctrl-C the test sends."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def write_source(folder: Path, **sections: Any) -> Path:
    """Write a source YAML into ``folder`` with sensible test defaults, overridden by sections.

    A section is merged into the default one, unless it names another ``type`` (``sink={"type":
    "postgres", ...}``): then it replaces the default (a JSONL sink's ``path`` would not fit)."""
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
        default = source.get(key)
        if (
            isinstance(value, dict)
            and isinstance(default, dict)
            and (value.get("type", default.get("type")) == default.get("type"))
        ):
            source[key] = {**default, **value}
        else:  # another kind of section (a Postgres sink for the JSONL one): in its place
            source[key] = value
    path = folder / "source.yaml"
    path.write_text(yaml.safe_dump(source, sort_keys=False), encoding="utf-8")
    return path


# The price suite's row-level expectations (tests/test_validation_oracle.py; the quarantine
# scenario adds "currency is not null").
PRICE_EXPECTATIONS: list[dict[str, Any]] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "price"}},
    {"type": "expect_column_values_to_be_of_type", "kwargs": {"column": "price", "type_": "float"}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "price", "min_value": 1, "max_value": 50},
    },
    {
        "type": "expect_column_values_to_match_regex",
        "kwargs": {"column": "title", "regex": r"^\S(?:.*\S)?$"},
    },
    {
        "type": "expect_column_values_to_be_in_set",
        "kwargs": {"column": "currency", "value_set": ["EUR", "USD"]},
    },
]


def write_suite(path: Path, expectations: list[dict[str, Any]], name: str = "") -> Path:
    """A suite file (``{"name", "expectations"}``) at ``path``, named after the file unless
    ``name`` says otherwise; returns ``path``."""
    suite = {"name": name or path.stem, "expectations": expectations}
    path.write_text(json.dumps(suite), encoding="utf-8")
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


@dataclass(frozen=True, slots=True)
class HeldLock:
    """A source lock whose one slot is taken (:func:`hold_source_lock`)."""

    name: str  # the concurrency limit, ``source:<name>``
    beat: str  # the holder's beat Variable (flows/_locks.py), the test's to write
    lease_id: str  # "" when the slot was taken without a lease


async def hold_source_lock(source_name: str, *, lease_s: float | None = None) -> HeldLock:
    """The lock of ``source_name`` with its slot taken as a holder that died leaves it: with a
    lease of ``lease_s`` (how a run takes it), or, without ``lease_s``, as a bare count (how a
    SIGKILL leaves it on a server with no lease repossessor). Needs the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from collector.run.locks import source_lock_name
    from flows._locks import ensure_limit
    from flows._variables import variable_name

    name = source_lock_name(source_name)
    await ensure_limit(name, 1)
    lease_id = ""
    async with get_client() as client:
        if lease_s is None:
            await client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(active_slots=1)
            )
        else:
            taken = await client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency", lease_duration=lease_s
            )
            lease_id = str(taken.json()["lease_id"])
    return HeldLock(name, variable_name("collector-lock", source_name), lease_id)


async def drain_in_process(run: Collection, *, batch_size: int) -> None:
    """Plan already made: fetch and settle ``run`` to its end in this process (no Prefect), then
    close its lanes; the caller reads ``run.finish()`` / ``run.summary()``."""
    from collector.run.drain import DrainPolicy, drain

    async with run.engine() as engine:

        async def fetch(lease: Lease) -> list[FetchResult]:
            return await run.fetch(engine, lease)

        try:
            await drain(run, fetch, DrainPolicy(batch_size=batch_size))
        finally:
            await run.aclose()
