"""Traps a new user fell into on a fifth trial from outside (init, run, status, review, a
deleted sink, a renamed source): each now says in one line what is wrong and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from tests.helpers import write_source


def test_a_source_given_by_its_name_or_misspelt_names_the_file_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_source(tmp_path).rename(tmp_path / "shop.yaml")
    (tmp_path / "shop.suite.json").write_text("{}", encoding="utf-8")  # not a source
    for given, hint in [
        ("shop", f"{tmp_path}/shop.yaml is there: give the source's file, not its name"),
        ("shpo.yaml", f"did you mean {tmp_path}/shop.yaml?"),
    ]:
        assert main(["status", str(tmp_path / given)]) == 2
        assert capsys.readouterr().err == f"{tmp_path / given}: file not found ({hint})\n"
    assert main(["validate", str(tmp_path / "other.yaml")]) == 2  # nothing like it: no guess
    assert capsys.readouterr().err == f"{tmp_path / 'other.yaml'}: file not found\n"
