"""Is the holder of a source lock alive? Judged from its beat record, without Prefect.

A holder of ``source:<name>`` publishes a :class:`LockBeat` every ``HEARTBEAT_S`` (where: the
flows' business, ``flows/_locks.py``). Anyone who finds the lock taken judges it here:

- dead at once when the holder ran on this machine and its process is gone (same host name,
  boot id and pid namespace, and no process with that pid and start time): a rerun after a
  SIGKILL on one machine does not wait out the silence bound;
- dead when its beat is older than ``HOLDER_DEAD_AFTER_S`` (the frontier's rule for holders,
  :mod:`collector.run.heartbeat`), wherever it ran;
- alive otherwise, with how long it may still take to call it dead if it stays silent.

A false "alive" only costs waiting; a false "dead" would let two runs overlap, so the process
check needs the pid *and* its start time to be gone (a reused pid is still "alive").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collector import defaults

__all__ = [
    "LockBeat",
    "Verdict",
    "judge_beat",
    "machine",
    "pid_exists",
    "process_started",
    "this_process",
]


def machine() -> str:
    """Where pids mean the same thing: host name, boot id and pid namespace (two containers on
    one host may share a host name, e.g. with host networking, but not a pid namespace)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{boot}/{namespace}"


def process_started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc); None when gone.

    Without /proc (not Linux) a process that exists says "" (alive, start unknown).
    """
    if not Path("/proc/self").exists():
        return "" if pid_exists(pid) else None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie has ended; only its parent has not looked yet
        return None
    return fields[19]  # field 22 of stat: starttime


def pid_exists(pid: int) -> bool:
    """A process ``pid`` exists on this machine (one of another user counts; a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def this_process() -> tuple[str, int, str]:
    """(machine, pid, start) of the calling process, for a :class:`LockBeat`."""
    pid = os.getpid()
    return machine(), pid, process_started(pid) or ""


@dataclass(frozen=True, slots=True)
class LockBeat:
    """What a lock holder says about itself each beat (stored as JSON)."""

    holder: str  # the run's id (a flow run id for runs and triage)
    at: float  # wall-clock time of the beat
    machine: str = ""
    pid: int = 0
    started: str = ""  # the process's start time, as /proc tells it
    lease_id: str = ""  # the Prefect lease the holder took the lock with

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: object) -> LockBeat | None:
        """The beat in ``value``; None when it is not one (absent, or written by hand)."""
        if not isinstance(value, dict) or not isinstance(value.get("holder"), str):
            return None
        try:
            return cls(
                holder=value["holder"],
                at=float(value.get("at", 0.0)),
                machine=str(value.get("machine", "")),
                pid=int(value.get("pid", 0)),
                started=str(value.get("started", "")),
                lease_id=str(value.get("lease_id", "")),
            )
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Dead or alive, why (a phrase for a log line), and the longest wait left if alive."""

    dead: bool
    why: str
    wait_s: float = 0.0


def judge_beat(
    beat: LockBeat,
    *,
    now: float,
    here: str,
    started: Callable[[int], str | None] = process_started,
    dead_after_s: float = defaults.HOLDER_DEAD_AFTER_S,
) -> Verdict:
    """Judge ``beat`` seen from machine ``here`` at ``now`` (see the module's rules)."""
    age = max(0.0, now - beat.at)
    if beat.machine and beat.machine == here and beat.pid > 0:
        current = started(beat.pid)
        if current is None or (beat.started and current and current != beat.started):
            return Verdict(True, f"its process {beat.pid} on this machine is gone")
    if age > dead_after_s:
        return Verdict(
            True, f"it gave no sign of life for {age:.0f}s (dead after {dead_after_s:g}s)"
        )
    where = f"pid {beat.pid} on {beat.machine.split('/')[0]}" if beat.pid else "a process"
    return Verdict(
        False,
        f"it ({where}) beat {age:.0f}s ago",
        wait_s=dead_after_s - age,
    )
