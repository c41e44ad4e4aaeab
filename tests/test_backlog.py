"""Backlog watermark engine: depth, capacity, hysteresis (property tests), state round trip."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.config import SourceError, parse_source
from collector.frontier.base import StateCounts
from collector.ops.backlog import (
    BacklogSettings,
    BacklogState,
    Sample,
    Thresholds,
    next_level,
    sample_of,
    sparkline,
    trend_markdown,
)

T = Thresholds()  # 60 / 50 and 80 / 70 %


def _run(ratios: list[float], thresholds: Thresholds = T) -> tuple[BacklogState, list[str]]:
    state = BacklogState()
    events = []
    for i, ratio in enumerate(ratios):
        transition = state.observe(Sample(i, round(ratio * 10**6), 10**6), thresholds, keep=10)
        if transition is not None:
            events.append(transition.event)
    return state, events


def test_rising_and_falling_through_both_levels() -> None:
    _, events = _run([0.1, 0.55, 0.6, 0.75, 0.8, 0.95, 0.75, 0.69, 0.55, 0.49, 0.0])
    assert events == [
        "collector.backlog.warning",  # 0.6 reached
        "collector.backlog.critical",  # 0.8 reached
        "collector.backlog.warning",  # below critical_clear 0.7
        "collector.backlog.recovered",  # below warning_clear 0.5
    ]


def test_critical_falls_straight_to_ok_below_warning_clear() -> None:
    _, events = _run([0.9, 0.1])
    assert events == ["collector.backlog.critical", "collector.backlog.recovered"]


@given(st.lists(st.floats(min_value=0.5, max_value=0.5999), min_size=1, max_size=50))
def test_no_flapping_inside_the_warning_band(wobble: list[float]) -> None:
    """Once warning, a ratio wobbling between warning_clear and warning raises nothing more."""
    _, events = _run([0.65, *wobble])
    assert events == ["collector.backlog.warning"]


@given(st.lists(st.floats(min_value=0.7, max_value=0.7999), min_size=1, max_size=50))
def test_no_flapping_inside_the_critical_band(wobble: list[float]) -> None:
    _, events = _run([0.85, *wobble])
    assert events == ["collector.backlog.critical"]


@given(st.lists(st.floats(min_value=0.0, max_value=0.5999), min_size=1, max_size=50))
def test_below_warning_from_ok_never_raises(ratios: list[float]) -> None:
    state, events = _run(ratios)
    assert events == [] and state.level == "ok"


@given(st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=1, max_size=60))
def test_events_exactly_on_level_changes(ratios: list[float]) -> None:
    """Events are emitted iff the level changes, and the level always respects the thresholds."""
    state = BacklogState()
    for i, ratio in enumerate(ratios):
        before = state.level
        transition = state.observe(Sample(i, round(ratio * 10**6), 10**6), T, keep=5)
        assert (transition is not None) == (state.level != before)
        r = state.samples[-1].ratio
        if r >= T.critical:
            assert state.level == "critical"
        elif r < T.warning_clear:
            assert state.level == "ok"
        elif r >= T.warning:
            assert state.level in ("warning", "critical")
        if transition is not None:
            assert transition.event.endswith("recovered" if state.level == "ok" else state.level)
    assert len(state.samples) == min(5, len(ratios))


@given(
    st.floats(0.05, 0.5),
    st.floats(0.01, 0.3),
    st.floats(0.01, 0.3),
    st.lists(st.floats(0.0, 1.5), max_size=40),
)
def test_no_event_repeats_for_any_valid_band(
    warning: float, gap: float, critical_gap: float, ratios: list[float]
) -> None:
    """For any valid band, two consecutive events never have the same name (no repeats)."""
    thresholds = Thresholds(warning, warning * 0.8, warning + gap, warning + gap * 0.9)
    if thresholds.problems():
        return
    _, events = _run(ratios, thresholds)
    assert all(a != b for a, b in itertools.pairwise(events))


def test_next_level_table() -> None:
    assert next_level("ok", 0.59, T) == "ok"
    assert next_level("ok", 0.6, T) == "warning"
    assert next_level("warning", 0.5, T) == "warning"
    assert next_level("warning", 0.4999, T) == "ok"
    assert next_level("critical", 0.7, T) == "critical"
    assert next_level("critical", 0.6999, T) == "warning"


def test_depth_counts_queued_leased_and_expired_and_default_capacity_is_all_items() -> None:
    counts = StateCounts(queued=3, leased=2, done=10, dead=4, expired=1)
    sample = sample_of(counts, BacklogSettings(), now=0)
    assert (sample.depth, sample.capacity) == (6, 20)
    assert sample_of(counts, BacklogSettings(capacity=8), now=0).ratio == 0.75
    assert sample_of(StateCounts(), BacklogSettings(), now=0).ratio == 0.0  # empty frontier


def test_state_round_trips_and_tolerates_garbage() -> None:
    state, _ = _run([0.2, 0.9])
    again = BacklogState.from_json(state.to_json())
    assert again.level == "critical"
    assert [(s.depth, s.capacity) for s in again.samples] == [(200_000, 10**6), (900_000, 10**6)]
    assert BacklogState.from_json(None) == BacklogState()
    odd = BacklogState.from_json({"level": "panic", "samples": [[1, "x", 2], [1, 2], [3, 4, 5]]})
    assert odd.level == "ok" and [(s.depth, s.capacity) for s in odd.samples] == [(4, 5)]


def test_state_of_max_samples_fits_a_prefect_variable() -> None:
    import json

    from prefect.types import MAX_VARIABLE_VALUE_LENGTH

    settings = BacklogSettings(samples=100)
    state = BacklogState()
    for i in range(150):
        state.observe(Sample(1.8e9 + i, 10**9, 10**9), T, keep=settings.samples)
    assert len(json.dumps(state.to_json())) < MAX_VARIABLE_VALUE_LENGTH


def test_sparkline_and_markdown() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.0, 2.0]) == "▁█"  # scaled to the peak above 100 %
    state, _ = _run([0.1, 0.65])
    text = trend_markdown("shop", state, T)
    assert "warning" in text.splitlines()[0]
    assert "| 650000 | 1000000 | 65.0% |" in text
    assert text.index("65.0%") < text.index("10.0%")  # newest first


def _source(backlog: object) -> dict[str, Any]:
    return {
        "name": "x",
        "seeds": {"urls": ["http://a.example/"]},
        "record": {"key": "id"},
        "sink": {"path": "out"},
        "backlog": backlog,
    }


def test_backlog_section_in_a_source() -> None:
    source = parse_source(_source({"capacity": 500}), label="s.yaml", base_dir=Path("."))
    assert source.backlog.capacity == 500
    assert source.backlog.thresholds == Thresholds()


@pytest.mark.parametrize(
    ("backlog", "problem"),
    [
        ({"warning": 0.9}, "s.yaml: backlog: needs warning < critical"),
        ({"warning_clear": 0.6}, "s.yaml: backlog: needs 0 < warning_clear < warning"),
        ({"critical_clear": 0.85}, "needs warning_clear <= critical_clear < critical"),
        ({"capacity": 0}, "s.yaml: backlog.capacity: Input should be greater than or equal to 1"),
        ({"samples": 1000}, "s.yaml: backlog.samples:"),
        ({"capcity": 5}, "s.yaml: backlog.capcity: unknown key"),
    ],
)
def test_bad_backlog_section_is_one_line_naming_the_field(
    backlog: dict[str, Any], problem: str
) -> None:
    with pytest.raises(SourceError) as caught:
        parse_source(_source(backlog), label="s.yaml", base_dir=Path("."))
    assert len(caught.value.problems) == 1
    assert problem in caught.value.problems[0]
