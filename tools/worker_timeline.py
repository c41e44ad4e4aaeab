"""Each pytest-xdist worker's busy time and idle tail, from ``COLLECTOR_TEST_TIMELINE`` files.

Why: the suite runs a file to a worker (``--dist loadfile``), so its wall time is the last
worker's end, not the sum over four. This says which files each worker ran, in order, how long
each took, and how long each worker sat idle while another finished: what tests/lanes.py's
order and the worker count are tuned against (issue 30). It also sums the CPU seconds each file
used (its own process and the processes it started and stopped) and the session Prefect
servers' CPU while it ran: beside other work the suite is CPU-bound, and CPU is what a shorter
CI has to cut. Last, the longest files with their worker and start: the seconds tests/lanes.py's
LONGEST_FIRST is kept in order by.

    COLLECTOR_TEST_TIMELINE=/tmp/tl ./bootstrap test && python -m tools.worker_timeline /tmp/tl
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

Span = tuple[float, float, str, float, float]  # start, end, test id, CPU s, API server CPU s


def _spans(folder: Path) -> dict[str, list[Span]]:
    spans: dict[str, list[Span]] = {}
    for path in sorted(folder.glob("*.tsv")):
        rows = []
        for line in path.read_text().splitlines():
            fields = line.split("\t", 4)  # start, end, cpu, api cpu, test id
            if len(fields) < 5:  # written before CPU was recorded: start, end, test id
                fields = [fields[0], fields[1], "0", "0", "\t".join(fields[2:])]
            start, end, cpu, api, nodeid = fields
            rows.append((float(start), float(end), nodeid, float(cpu), float(api)))
        spans[path.stem] = sorted(rows)
    return spans


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def report(folder: Path) -> str:
    """One block per worker: its files in the order run (seconds each), busy, and idle tail."""
    spans = _spans(folder)
    if not spans:
        return f"no timeline files (*.tsv) in {folder}"
    t0 = min(rows[0][0] for rows in spans.values())
    t_end = max(rows[-1][1] for rows in spans.values())
    lines = [f"wall (first test start to last test end): {t_end - t0:.0f} s"]
    for worker, rows in spans.items():
        per_file: dict[str, float] = defaultdict(float)
        order: list[str] = []
        for start, end, nodeid, _, _ in rows:
            name = _file(nodeid)
            if name not in per_file:
                order.append(name)
            per_file[name] += end - start
        busy = sum(per_file.values())
        tail = t_end - rows[-1][1]
        lines.append(f"{worker}: busy {busy:.0f} s, idle at the end {tail:.0f} s")
        top = sorted(order, key=lambda n: -per_file[n])[:8]
        lines.append("    " + ", ".join(f"{n} {per_file[n]:.0f}" for n in top))
        lines.append(f"    last: {order[-1]} (ended {rows[-1][1] - t0:.0f} s in)")
    lines += _cpu_lines(spans)
    lines += _file_lines(spans, t0)
    return "\n".join(lines)


def _file_lines(spans: dict[str, list[Span]], t0: float, top: int = 30) -> list[str]:
    """The longest files, each with its worker and when it started: what tests/lanes.py's
    LONGEST_FIRST is re-measured from. A long file that started late ran alone at the end (a
    file missing from LONGEST_FIRST is dispatched after all of those listed)."""
    seconds: dict[str, float] = defaultdict(float)
    where: dict[str, tuple[str, float]] = {}
    for worker, rows in spans.items():
        for start, end, nodeid, _, _ in rows:
            name = _file(nodeid)
            seconds[name] += end - start
            if name not in where or start - t0 < where[name][1]:
                where[name] = (worker, start - t0)
    lines = [f"files by seconds (the {min(top, len(seconds))} longest): seconds, worker, start"]
    for name in sorted(seconds, key=lambda n: -seconds[n])[:top]:
        worker, started = where[name]
        lines.append(f"    {name} {seconds[name]:.0f} ({worker}, {started:.0f} s in)")
    return lines


def _cpu_lines(spans: dict[str, list[Span]]) -> list[str]:
    """Total CPU, then the files that used most (their processes + the API server meanwhile)."""
    cpu: dict[str, float] = defaultdict(float)
    api: dict[str, float] = defaultdict(float)
    for rows in spans.values():
        for _, _, nodeid, used, served in rows:
            cpu[_file(nodeid)] += used
            api[_file(nodeid)] += served
    total, served_total = sum(cpu.values()), sum(api.values())
    if not total:
        return []
    lines = [f"CPU: {total:.0f} s in test processes and what they started, "
             f"{served_total:.0f} s in the session Prefect servers"]  # fmt: skip
    top = sorted(cpu, key=lambda n: -(cpu[n] + api[n]))[:15]
    lines.append("    " + ", ".join(f"{n} {cpu[n]:.0f}+{api[n]:.0f}" for n in top))
    return lines


if __name__ == "__main__":
    print(report(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
