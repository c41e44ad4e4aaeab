"""GX's verdict on a suite's kwargs, kept per content: the cached answer is the one GX gives,
a changed suite or GX is asked again, and two processes filling the cache at once are safe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.settle import gx_check_cache
from collector.settle.suite import _ask_gx, _gx_candidates, _position, _read_suite, kwargs_problems

ROOT = Path(__file__).resolve().parents[1]

# Each kind of expectation the check must catch, and good ones, to mix into suites.
EXPECTATIONS: list[Any] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"colum": "id"}},  # GX kwargs
    {"type": "expect_column_values_to_not_be_nul", "kwargs": {"column": "id"}},  # misspelt
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "t", "regex": "(["}},
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "t", "regex": "^a"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "p", "min_value": "x"}},
    {"type": "expect_column_values_to_be_of_type", "kwargs": {"column": "p", "type_": "int"}},
    {"type": "expect_column_values_to_be_of_type", "kwargs": {"column": "p", "type_": "nope"}},
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
    {"kwargs": {"column": "id"}},  # no type
    "not an object",
]


def reference(path: Path) -> list[str]:
    """The plain check: every problem of the file, GX asked directly, no cache."""
    problems = _read_suite(path)[1]
    problems += [f"{path}: {line}" for _, line in _ask_gx(_gx_candidates(path.read_bytes()))]
    return sorted(problems, key=_position)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(folder))
    return folder


@settings(max_examples=40)
@given(st.lists(st.sampled_from(range(len(EXPECTATIONS))), max_size=6))
def test_cached_verdicts_agree_with_asking_gx(picks: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "suite.json"
        path.write_text(json.dumps({"expectations": [EXPECTATIONS[i] for i in picks]}))
        previous = os.environ.get("COLLECTOR_CACHE_DIR")
        os.environ["COLLECTOR_CACHE_DIR"] = str(Path(folder) / "cache")
        try:
            cold, warm = kwargs_problems(path), kwargs_problems(path)
        finally:
            if previous is None:
                del os.environ["COLLECTOR_CACHE_DIR"]
            else:
                os.environ["COLLECTOR_CACHE_DIR"] = previous
        assert cold == warm == reference(path)


def test_every_kind_of_problem_is_said_at_once_from_the_cache_too(cache: Path) -> None:
    path = Path(cache.parent / "suite.json")
    path.write_text(json.dumps({"expectations": EXPECTATIONS[:4]}))
    for _ in range(2):  # cold, then from the cache
        problems = kwargs_problems(path)
        assert [_position(line) for line in problems] == [1, 2, 3]
        assert "colum: extra fields not permitted" in problems[0]
        assert "did you mean 'expect_column_values_to_not_be_null'" in problems[1]
        assert "invalid regex '(['" in problems[2]
    assert len(list((cache / "gx-kwargs").iterdir())) == 1


def test_a_new_suite_or_a_new_gx_asks_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def check() -> list[tuple[int, str]]:
        asked.append(1)
        return [(0, "expectations[0] (x): invalid kwargs: y")]

    assert gx_check_cache.cached_verdict(b"suite one", check) == check()
    asked.clear()
    gx_check_cache.cached_verdict(b"suite one", check)
    assert asked == []  # from the cache
    gx_check_cache.cached_verdict(b"suite two", check)
    assert asked == [1]  # other bytes
    monkeypatch.setattr(gx_check_cache, "_gx_version", lambda: "99.0")
    gx_check_cache.cached_verdict(b"suite one", check)
    assert asked == [1, 1]  # another GX


def test_an_unreadable_entry_is_asked_again_and_replaced(cache: Path) -> None:
    entry = cache / "gx-kwargs" / f"{gx_check_cache.verdict_key(b'suite')}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text('{"problems": [[0, "half')
    verdict = [(2, "expectations[2] (x): invalid kwargs: z")]
    assert gx_check_cache.cached_verdict(b"suite", lambda: verdict) == verdict
    assert json.loads(entry.read_text()) == {"problems": [list(verdict[0])]}


def test_an_unwritable_cache_only_costs_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(blocked))
    assert gx_check_cache.cached_verdict(b"suite", lambda: []) == []


def test_two_processes_filling_the_cache_at_once_both_get_the_verdict(
    cache: Path, tmp_path: Path
) -> None:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"expectations": EXPECTATIONS[:3]}))
    script = (
        "import json, sys; from collector.settle.suite import kwargs_problems; "
        "print(json.dumps(kwargs_problems(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLLECTOR_CACHE_DIR": str(cache)}
    both = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    answers = [json.loads(process.communicate(timeout=120)[0]) for process in both]
    assert answers[0] == answers[1] == reference(path)
    entries = list((cache / "gx-kwargs").iterdir())
    assert [entry.suffix for entry in entries] == [".json"]  # one whole entry, no leftovers
    assert kwargs_problems(path) == answers[0]
