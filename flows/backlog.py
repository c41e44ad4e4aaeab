"""The ``backlog-monitor`` flow: each source's depth against its capacity, events on change.

Per source it reads the frontier's counts (``collector.ops.backlog`` decides depth, capacity and the
level with hysteresis), keeps the level and the last samples in the Prefect Variable
``collector-backlog-<source>`` (so the state works the same for SQLite and Redis frontiers and
for any worker), emits ``collector.backlog.warning|critical|recovered`` only on a level change,
and publishes the trend as a markdown artifact (``collector-<source>-backlog``). Meant to run on
a schedule (deployment ``backlog-monitor``), one run at a time.

The flow is synchronous, so ``backlog_monitor(sources=[...])`` runs it from plain Python (an
async flow returned an un-awaited coroutine there and did nothing); ``collector backlog SOURCE``
is the command form.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event
from prefect.variables import Variable
from pydantic import Field

from collector.backends import open_frontier
from collector.config import Source
from collector.errors import CollectorError
from collector.ops.backlog import BacklogState, sample_of, trend_markdown
from flows._variables import variable_name
from flows.sources import resolve_source

__all__ = ["backlog_monitor", "state_variable"]


def state_variable(source: str) -> str:
    """The Prefect Variable holding a source's backlog level and samples."""
    return variable_name("collector-backlog", source)


def _artifact_key(source: str) -> str:
    safe = "".join(ch if ch.isalnum() else "-" for ch in source.lower())
    return f"collector-{safe}-backlog"[:100]


def _observe(loaded: Source) -> dict[str, Any]:
    frontier = open_frontier(loaded)
    try:
        counts = frontier.counts(loaded.name)
    finally:
        frontier.close()
    settings = loaded.backlog
    sample = sample_of(counts, settings, now=time.time())
    name = state_variable(loaded.name)
    kept = Variable.get(name, default=None, _sync=True)  # type: ignore[call-overload]
    state = BacklogState.from_json(kept)
    transition = state.observe(
        sample, settings.thresholds, keep=settings.samples, trend_s=settings.trend_s
    )
    if transition is not None:
        # Before saving the state: a failed save repeats the event next run, never loses it.
        emit_event(
            event=transition.event,
            resource={"prefect.resource.id": f"collector.source.{loaded.name}"},
            payload=transition.payload(loaded.name),
        )
    Variable.set(name, state.to_json(), overwrite=True, _sync=True)  # type: ignore[call-arg]
    create_markdown_artifact(
        trend_markdown(loaded.name, state, settings.thresholds),
        key=_artifact_key(loaded.name),
        description=f"Backlog trend of {loaded.name}",
        _sync=True,  # type: ignore[call-arg]
    )
    return {
        "source": loaded.name,
        "depth": sample.depth,
        "capacity": sample.capacity,
        "ratio": round(sample.ratio, 4),
        "level": state.level,
        "event": transition.event if transition else None,
    }


@flow(name="backlog-monitor", validate_parameters=True)
def backlog_monitor(
    sources: Annotated[
        list[str], Field(min_length=1, description="Sources to watch: file paths, or block:<name>.")
    ],
) -> list[dict[str, Any]]:
    """Sample every source's backlog; one bad source does not hide the others (it fails the
    run at the end, after the rest were sampled)."""
    logger = get_run_logger()
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    for path in sources:
        try:
            loaded = resolve_source(path)
            result = _observe(loaded)
        except CollectorError as exc:
            failures.append(f"{path}: {exc}")
            logger.error("backlog of %s not sampled: %s", path, exc)
            continue
        logger.info(
            "%s: depth %d / capacity %d = %.0f %% (%s)",
            result["source"], result["depth"], result["capacity"], 100 * result["ratio"],
            result["level"],
        )  # fmt: skip
        results.append(result)
    if failures:
        raise CollectorError("backlog not sampled for: " + " | ".join(failures))
    return results
