"""The terminal's progress line keeps its count readable at 80 columns, however long its detail.

A loaded CI box made the adaptive window slow the test site's host, the detail grew by "1 host
slowed", and rich squeezed every column of the run's last line: the count read "3…" (the pty
test in tests/test_cli_terminal.py failed on it, twice). The detail column is now the one cut."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from collector.run.summary import RunSummary
from flows.cli import running


@pytest.mark.parametrize("width", [80, 120])
def test_the_last_line_keeps_its_count_beside_a_long_detail(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=True, highlight=False)
    monkeypatch.setattr(running, "_console", lambda: console)
    progress = running._Progress(enabled=True)
    progress.start("starting Prefect ...")
    progress("planned", {"to_fetch": 1000, "discovered": 1000})
    ledger = SimpleNamespace(stored=990, dead_lettered=10, already_dead=0, retried=120,
                             deferred_by_circuit=37, settled_items=1000)  # fmt: skip
    report = SimpleNamespace(windows={"a.example": 8, "b.example": 32},
                             slowed={"a.example": "window", "b.example": "pace"})  # fmt: skip
    progress("batch", {"ledger": ledger, "report": report})
    progress.finish(RunSummary(source="s", run_id="r", stored=990, dead_lettered=10))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    lines = [line for line in re.split(r"[\r\n]", text) if "collect" in line]
    last = lines[-1]
    assert "1000/1000" in last and "stored 990" in last, last
    assert len(last) <= width, last
