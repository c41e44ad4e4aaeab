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

Memory pressure is reported the same way, as the label ``collector.memory``: the share of the
memory the helper may use that is in use where it runs (:func:`memory_share`): its cgroup's
usage over its limit when the cgroup has one (a container, a systemd slice: what the OOM killer
counts), else the machine's ``1 - MemAvailable / MemTotal``. Not the helper's own RSS: what
runs out is the box or container the helpers share, and another helper there makes it worse.
:func:`helpers_memory` is the highest over the helpers that reported (one box near its limit
is enough to stop adding to it). Prefect-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "CPU_LABEL",
    "MEMORY_LABEL",
    "CpuMeter",
    "cpu_of",
    "helpers_cpu",
    "helpers_memory",
    "memory_share",
    "memory_share_of",
]

CPU_LABEL = "collector.cpu"
"""The flow-run label a helper publishes its CPU share under (a float, 1.0: one full core)."""
MEMORY_LABEL = "collector.memory"
"""The flow-run label a helper publishes its memory share under (0..1 of what it may use)."""
_CGROUP_V2 = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max")
_CGROUP_V1 = (
    "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


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


def memory_share_of(
    cgroup_usage: str | None, cgroup_limit: str | None, meminfo: str | None
) -> float | None:
    """The memory share in use from the files' texts: the cgroup's usage / limit when it has
    a limit below the machine's memory, else ``1 - MemAvailable / MemTotal`` (None: unknown)."""
    fields: dict[str, int] = {}
    for line in (meminfo or "").splitlines():
        name, _, rest = line.partition(":")
        number = rest.split()[:1]
        if number and number[0].isdigit():
            fields[name.strip()] = int(number[0]) * 1024
    total = fields.get("MemTotal", 0)
    usage, limit = (cgroup_usage or "").strip(), (cgroup_limit or "").strip()
    if usage.isdigit() and limit.isdigit() and int(limit) > 0 and (not total or int(limit) < total):
        return min(1.0, int(usage) / int(limit))
    if total > 0 and "MemAvailable" in fields:
        return min(1.0, max(0.0, 1 - fields["MemAvailable"] / total))
    return None


def memory_share() -> float | None:
    """This process's memory share where it runs (cgroup v2, v1, then the machine's)."""

    def text(path: str) -> str | None:
        try:
            with open(path, encoding="ascii") as handle:
                return handle.read()
        except (OSError, ValueError):
            return None

    meminfo = text("/proc/meminfo")
    for usage, limit in (_CGROUP_V2, _CGROUP_V1):
        limit_text = text(limit)
        if limit_text is not None:  # "max" or above the machine: the machine's figure
            return memory_share_of(text(usage), limit_text, meminfo)
    return memory_share_of(None, None, meminfo)


def cpu_of(labels: Mapping[str, Any] | None) -> float | None:
    """The CPU share a helper reported in its labels (None: none yet, or not a number)."""
    return _share(labels, CPU_LABEL)


def _share(labels: Mapping[str, Any] | None, key: str) -> float | None:
    value = (labels or {}).get(key)
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


def helpers_memory(labels: Iterable[Mapping[str, Any] | None]) -> float | None:
    """The highest memory share the helpers reported (None: none did)."""
    shares = [s for s in (_share(x, MEMORY_LABEL) for x in labels) if s is not None]
    return max(shares) if shares else None
