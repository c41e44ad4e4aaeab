"""The terminal's progress display keeps its count readable at 80 columns, however long the
account under it.

A loaded CI box made the adaptive window slow the test site's host, the detail grew by "1 host
slowed", and rich squeezed every column of the run's last line: the count read "3…" (the pty
test in tests/test_cli_terminal.py failed on it, twice). The account now has lines of its own
under the bar, broken between terms, so neither is cut."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from collector.run.summary import RunSummary
from flows.cli._progress import Progress


@pytest.mark.parametrize("width", [80, 120])
def test_the_last_line_keeps_its_count_beside_a_long_detail(width: int) -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=True, highlight=False)
    progress = Progress(enabled=True, console=console)
    progress.start("starting Prefect ...")
    progress("planned", {"to_fetch": 1000, "discovered": 1000})
    summary = RunSummary(source="s", run_id="r", discovered=1000, stored=990, dead_lettered=10,
                         retried=120, deferred_by_circuit=37, not_modified=0)  # fmt: skip
    report = SimpleNamespace(windows={"a.example": 8, "b.example": 32},
                             slowed={"a.example": "window", "b.example": "pace"})  # fmt: skip
    progress("batch", {"ledger": summary, "report": report})
    progress.finish(summary)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    lines = [line for line in re.split(r"[\r\n]", text) if line.strip()]
    bars = [line for line in lines if "collect" in line]
    assert "1000/1000" in bars[-1], bars[-1]
    tail = " ".join(lines[lines.index(bars[-1]) :])
    for word in ("stored 990", "dead_lettered 10", "retried 120", "deferred_by_circuit 37"):
        assert word in tail, tail
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
