"""The fleet's table artifact: a new version when the fleet did something, figures at most
every 15 s, and the last table computed always shown at the end (collector.fleet.table)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.fleet.table import SUBSTANCE, TablePacer


def _row(source: str = "a", helpers: int = 1, backlog: int = 10, why: str = "x") -> dict[str, Any]:
    return {"source": source, "class": "normal", "backlog": backlog, "wait": "1.0 s",
            "helpers": helpers, "coming": 0, "share": helpers, "why": why}  # fmt: skip


def test_a_helper_started_is_shown_at_once_and_figures_wait() -> None:
    pacer = TablePacer(figures_every_s=15.0)
    first = [_row(helpers=1, backlog=10)]
    assert pacer.due(first, 0.0)
    pacer.written(first, 0.0)
    assert not pacer.due(first, 100.0)  # the same table is never written twice
    figures = [_row(helpers=1, backlog=9, why="claim wait 9 s")]
    assert not pacer.due(figures, 1.0)  # figures alone: not before 15 s
    assert pacer.due([_row(helpers=2, backlog=9)], 1.0)  # it did something: at once
    assert pacer.due([_row(helpers=1), _row(source="b")], 1.0)  # a source added
    assert pacer.due(figures, 15.0)
    assert pacer.held_back(figures) and not pacer.held_back(first)
    assert not pacer.held_back(None)


# a table: rows of a few sources, substance and figures drawn small so that both repeat
_tables = st.lists(
    st.builds(
        _row,
        source=st.sampled_from(["a", "b", "c"]),
        helpers=st.integers(0, 2),
        backlog=st.integers(0, 2),
        why=st.sampled_from(["x", "y"]),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_tables, st.floats(0.0, 10.0)), max_size=40), st.floats(1.0, 20.0))
def test_what_is_written_follows_the_rule(
    steps: list[tuple[list[Any], float]], every: float
) -> None:
    pacer = TablePacer(figures_every_s=every)
    now = 0.0
    shown: list[Any] | None = None
    shown_at = float("-inf")
    last: list[Any] | None = None
    writes = figure_writes = 0
    for table, gap in steps:
        now += gap
        last = table
        substance = [tuple(r[c] for c in SUBSTANCE) for r in table]
        was = None if shown is None else [tuple(r[c] for c in SUBSTANCE) for r in shown]
        due = pacer.due(table, now)
        if table == shown:
            assert not due  # never the same version twice
        elif was != substance:
            assert due  # what the fleet did is shown at once
        else:
            assert due == (now - shown_at >= every)  # figures alone: paced
        if due:
            figure_writes += was == substance
            pacer.written(table, now)
            shown, shown_at, writes = table, now, writes + 1
    assert pacer.held_back(last) == (last is not None and last != shown)
    if pacer.held_back(last):  # the fleet's end: its last word is shown
        pacer.written(last or [], now)
        writes += 1
    assert pacer.shown == last  # the last version is the last table computed
    assert pacer.versions == writes
    assert pacer.figure_versions >= figure_writes  # the end's write may be one more
    assert pacer.figure_versions <= figure_writes + 1
