"""A helper's own report of its CPU, and how the autoscaler reads it back.

The busy share (collector.fleet.tracker) says whether a helper holds work; it cannot tell a
helper that waits on slow hosts from one whose process is saturated. The CPU share can: a
helper whose process used more than ``FLEET_CPU_HIGH`` (0.75) of a core over the last interval
is bound by its own loop, and another process (on any worker machine) adds throughput.

Each helper measures its process's CPU time over wall time between two reports
(:class:`CpuMeter`, ``time.process_time``: every thread of the process, the heartbeat's and the
store lanes' included) and publishes it as the label ``collector.cpu`` of its own flow run
(flows/_helper_report.py). The autoscaler already reads the helper runs at every decision, so
the figure comes with them: :func:`helpers_cpu` is the mean over the helpers that reported.
Prefect-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["CPU_LABEL", "CpuMeter", "cpu_of", "helpers_cpu"]

CPU_LABEL = "collector.cpu"
"""The flow-run label a helper publishes its CPU share under (a float, 1.0: one full core)."""


class CpuMeter:
    """A process's CPU share since the previous reading: CPU seconds / wall seconds.

    1.0 is one core busy all the time; threads running on several cores can push it above 1.
    The clocks are parameters so a test can drive them.
    """

    def __init__(
        self,
        cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpu = cpu
        self._wall = wall
        self._last = (cpu(), wall())

    def read(self) -> float | None:
        """The share over the interval since the last reading (None: no wall time passed)."""
        cpu, wall = self._cpu(), self._wall()
        last_cpu, last_wall = self._last
        if wall <= last_wall:
            return None
        self._last = (cpu, wall)
        return max(0.0, cpu - last_cpu) / (wall - last_wall)


def cpu_of(labels: Mapping[str, Any] | None) -> float | None:
    """The CPU share a helper reported in its labels (None: none yet, or not a number)."""
    value = (labels or {}).get(CPU_LABEL)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        share = float(value)
    except ValueError:
        return None
    return share if share >= 0 and share == share and share != float("inf") else None


def helpers_cpu(labels: Iterable[Mapping[str, Any] | None]) -> float | None:
    """The mean CPU share of the helpers that reported one (None: none did)."""
    shares = [s for s in map(cpu_of, labels) if s is not None]
    return sum(shares) / len(shares) if shares else None
