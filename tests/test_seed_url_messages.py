"""Seed URL mistakes a new user makes get a message that says what is wrong and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import SEED_LINES_CHECKED, SourceError, load_source
from collector.run.collection import Collection
from flows.cli import main
from tests.helpers import write_source


def test_a_url_without_scheme_slashes_is_not_called_a_scheme_none(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http//127.0.0.1/x"]})
    with pytest.raises(SourceError) as info:
        load_source(path)
    assert info.value.problems == [
        f"{path}: seeds.urls: item 0: not an absolute URL (no scheme://host): 'http//127.0.0.1/x'"
    ]


def test_a_literal_url_with_a_placeholder_points_to_template_and_range(tmp_path: Path) -> None:
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/ok", "http://127.0.0.1/items/{i}.json"]}
    )
    with pytest.raises(SourceError) as info:
        load_source(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: seeds.urls: item 1: ")
    assert "contains {i}" in problem and "seeds.template with seeds.range" in problem


def test_a_seed_file_line_with_a_placeholder_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "seeds.txt").write_text(
        "http://127.0.0.1/ok\nhttp://127.0.0.1/items/{i}.json\n", encoding="utf-8"
    )
    with pytest.raises(SourceError) as info:
        load_source(write_source(tmp_path, seeds={"file": "seeds.txt"}))
    (problem,) = info.value.problems
    assert "seeds.file line 2: " in problem and "contains {i}" in problem


def test_a_template_still_takes_its_placeholder(tmp_path: Path) -> None:
    path = write_source(
        tmp_path, seeds={"template": "http://127.0.0.1/items/{i}.json", "range": [0, 3]}
    )
    assert list(load_source(path).iter_seed_urls())[-1] == "http://127.0.0.1/items/2.json"


def test_a_bad_line_deep_in_a_seed_file_is_said_by_validate_and_refused_by_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A load checks the first SEED_LINES_CHECKED lines (a catalogue of millions loads in
    milliseconds); `collector validate` checks every line; a run refuses the bad one at plan,
    as a dead letter naming it, and collects the rest."""
    good = [f"http://127.0.0.1:9/items/{n}.json" for n in range(SEED_LINES_CHECKED + 5)]
    lines = [*good[:SEED_LINES_CHECKED], "http//127.0.0.1/typo", *good[SEED_LINES_CHECKED:]]
    (tmp_path / "seeds.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = write_source(tmp_path, seeds={"file": "seeds.txt"}, state_dir="state")
    source = load_source(path)  # the bad line is past the lines a load checks
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"seeds.file line {SEED_LINES_CHECKED + 1}: not an absolute URL" in err
    with Collection(source, run_id="r1") as run:
        ledger = run.plan()
        assert (ledger.discovered, ledger.refused_at_plan) == (len(lines), 1)
        (entry,) = run.deadletters.list(source=source.name, stage="plan", status="open")
        assert entry.url == "http//127.0.0.1/typo"
        assert run.finish().balanced
