"""Seed URL mistakes a new user makes get a message that says what is wrong and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import SourceError, load_source
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
