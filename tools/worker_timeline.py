"""Each pytest-xdist worker's busy time and idle tail, from ``COLLECTOR_TEST_TIMELINE`` files.

Why: the suite runs a file to a worker (``--dist loadfile``), so its wall time is the last
worker's end, not the sum over four. This says which files each worker ran, in order, how long
each took, and how long each worker sat idle while another finished: what tests/lanes.py's
order and the worker count are tuned against (issue 30).

    COLLECTOR_TEST_TIMELINE=/tmp/tl ./bootstrap test && python -m tools.worker_timeline /tmp/tl
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def _spans(folder: Path) -> dict[str, list[tuple[float, float, str]]]:
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for path in sorted(folder.glob("*.tsv")):
        rows = []
        for line in path.read_text().splitlines():
            start, end, nodeid = line.split("\t", 2)
            rows.append((float(start), float(end), nodeid))
        spans[path.stem] = sorted(rows)
    return spans


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
        for start, end, nodeid in rows:
            name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            if name not in per_file:
                order.append(name)
            per_file[name] += end - start
        busy = sum(per_file.values())
        tail = t_end - rows[-1][1]
        lines.append(f"{worker}: busy {busy:.0f} s, idle at the end {tail:.0f} s")
        top = sorted(order, key=lambda n: -per_file[n])[:8]
        lines.append("    " + ", ".join(f"{n} {per_file[n]:.0f}" for n in top))
        lines.append(f"    last: {order[-1]} (ended {rows[-1][1] - t0:.0f} s in)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
