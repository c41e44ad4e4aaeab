"""A flow run named and tagged by its source and role, wherever it was started.

Runs started from the terminal (``collector run``, ``work``, ``triage``) are created by Prefect
with a random name and no tags; runs of a deployment get the deployment's tags. So that both are
found the same way in the UI (a search for ``source:shop``, a filter on ``run``), each flow,
once it has read its source, names its own run ``<role>-<source>`` and adds the tags
``collector``, ``<role>``, ``source:<name>`` and ``class:<priority class>`` to those it has.
"""

from __future__ import annotations

import uuid

from prefect import get_client
from prefect.runtime import flow_run

from collector.config import Source

__all__ = ["label_run", "run_labels"]


def run_labels(role: str, source: Source, detail: str = "") -> tuple[str, list[str]]:
    """The run's name and its tags (besides those it already has)."""
    name = f"{role}-{source.name}" + (f"-{detail}" if detail else "")
    tags = ["collector", role, f"source:{source.name}", f"class:{source.priority.run_class}"]
    return name[:200], tags


async def label_run(role: str, source: Source, detail: str = "") -> None:
    """Name this flow run and add its tags (nothing outside a flow run)."""
    run_id = flow_run.get_id()
    if run_id is None:
        return
    name, tags = run_labels(role, source, detail)
    every = sorted({*(flow_run.get_tags() or []), *tags})
    async with get_client() as client:
        await client.update_flow_run(uuid.UUID(run_id), name=name, tags=every)
