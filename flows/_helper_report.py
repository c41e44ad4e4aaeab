"""A helper's report to the fleet: its process's CPU share and the memory share where it runs,
as labels of its own flow run.

A `collector work` helper started by the fleet (role ``work``) publishes every
``FLEET_REPORT_S`` the labels ``collector.cpu`` and ``collector.memory``
(collector.fleet.report) on its flow run. The
fleet reads the helper runs at each decision anyway, so the figure travels with them, on one
machine or many, with nothing more to deploy. The report runs on a thread, like the heartbeat:
a loop busy settling a batch is exactly when the figure matters. A report that fails (the API
away for a moment) is skipped; the next one says the same thing, fresher.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from typing import Any
from uuid import UUID

from collector import defaults
from collector.fleet.report import CPU_LABEL, MEMORY_LABEL, CpuMeter, memory_share

__all__ = ["HelperReport"]

log = logging.getLogger(__name__)


class HelperReport:
    """Publish this process's CPU and memory shares on flow run ``run_id`` every ``every_s``
    until exit."""

    def __init__(self, run_id: str, *, every_s: float = defaults.FLEET_REPORT_S) -> None:
        self.run_id = UUID(run_id)
        self.every_s = every_s
        self.meter = CpuMeter()
        self._stopped = threading.Event()
        # the creator's context: the Prefect API it chose by context, not the environment's
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run,), name="fleet-report", daemon=True
        )

    def __enter__(self) -> HelperReport:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=self.every_s + 10)

    def _run(self) -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not self._stopped.wait(self.every_s):
                share = self.meter.read()
                if share is None:
                    continue
                try:
                    client.update_flow_run_labels(self.run_id, _labels(share, memory_share()))
                except Exception as exc:  # a report is advisory: the next one says it again
                    with contextlib.suppress(Exception):
                        log.debug("fleet report of %s failed: %s", self.run_id, exc)


def _labels(cpu: float, memory: float | None) -> dict[str, Any]:
    labels: dict[str, Any] = {CPU_LABEL: round(cpu, 3)}
    if memory is not None:
        labels[MEMORY_LABEL] = round(memory, 3)
    return labels
