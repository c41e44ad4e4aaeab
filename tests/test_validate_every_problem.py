"""`collector validate` says every problem of a source at once, one line each naming the file
and the field, in file order, up to a cap: a user fixing a file should not have to run it once
per mistake. `collector run` on such a source prints the same lines, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.config import MAX_PROBLEMS
from flows.cli import main
from tests.helpers import write_source

SEEDS = {"urls": ["http://127.0.0.1:9/items/1.json"]}


def _validate(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert "ok (" not in captured.out
    return captured.err.splitlines()


def test_two_invalid_regexes_in_ttl_rules_are_both_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = [
        {"pattern": "([a-z", "fresh_s": 60},
        {"prefix": "http://127.0.0.1:9/", "fresh_s": 60},
        {"pattern": "*oops", "fresh_s": 60},
    ]
    path = write_source(tmp_path, seeds=SEEDS, ttl={"rules": rules})
    lines = _validate(path, capsys)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{path}: ttl.rules[0].pattern: invalid regular expression")
    assert lines[1].startswith(f"{path}: ttl.rules[2].pattern: invalid regular expression")


def test_two_inconsistent_ttl_pairs_are_both_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ttl = {"http_timeout_s": 20, "request_deadline_s": 10, "batch_timeout_s": 30, "lease_s": 30}
    path = write_source(tmp_path, seeds=SEEDS, ttl=ttl)
    lines = _validate(path, capsys)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{path}: ttl: http_timeout_s (20 s) must be <= request_deadline_s")
    assert lines[1].startswith(f"{path}: ttl: lease_s (30 s) must be greater than batch_timeout_s")


def test_every_bad_seed_url_in_the_list_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = ["ftp://127.0.0.1/a", "http://127.0.0.1:9/ok", "not a url", "http://127.0.0.1/{i}"]
    path = write_source(tmp_path, seeds={"urls": urls})
    lines = _validate(path, capsys)
    assert [line.split(": ", 2)[1] for line in lines] == ["seeds.urls"] * 3, lines
    assert [line.split(": ", 3)[2] for line in lines] == ["item 0", "item 2", "item 3"], lines


def test_two_bad_expectations_in_the_suite_are_both_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite.json"
    expectations = [
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "a", "regex": "(["}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_be_of_type", "kwargs": {"column": "a", "type_": "intt"}},
        {"type": "expect_column_to_be_purple", "kwargs": {"column": "a"}},
    ]
    suite.write_text(json.dumps({"name": "s", "expectations": expectations}), encoding="utf-8")
    path = write_source(tmp_path, seeds=SEEDS, validation={"suite": "suite.json"})
    lines = _validate(path, capsys)
    prefix = f"{path}: validation.suite: {suite}: expectations"
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{prefix}[0] (expect_column_values_to_match_regex): invalid regex")
    assert lines[1] == f"{prefix}[2] (expect_column_values_to_be_of_type): unknown type 'intt'"
    assert lines[2].startswith(f"{prefix}[3] (expect_column_to_be_purple): unknown expectation")


def test_two_expectations_missing_kwargs_are_both_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GX's kwargs check (validate only): every expectation GX refuses, not the first."""
    expectations = [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {}},
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_be_unique", "kwargs": {}},
    ]
    suite = {"name": "s", "expectations": expectations}
    path = write_source(tmp_path, seeds=SEEDS, validation={"suite": suite})
    lines = _validate(path, capsys)
    prefix = f"{path}: validation.suite: (inline suite): expectations"
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{prefix}[0] (expect_column_values_to_not_be_null): invalid kwargs")
    assert lines[1].startswith(f"{prefix}[2] (expect_column_values_to_be_unique): invalid kwargs")


def test_problems_from_every_stage_come_in_one_answer_in_a_stable_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A field problem does not hide the others; the same file gives the same lines again."""
    path = write_source(
        tmp_path,
        seeds=SEEDS,
        ttl={"rules": [{"pattern": "(", "fresh_s": 1}, {"pattern": ")", "fresh_s": 1}]},
        limits={"concurrency": 0, "per_domain_rate": "often"},
    )
    first = _validate(path, capsys)
    assert [line.split(": ")[1] for line in first] == [
        "ttl.rules[0].pattern",
        "ttl.rules[1].pattern",
        "limits.concurrency",
        "limits.per_domain_rate",
    ], first
    assert _validate(path, capsys) == first


def test_a_file_broken_everywhere_is_cut_at_the_cap_with_one_line_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = [{"pattern": f"({i}", "fresh_s": 1} for i in range(MAX_PROBLEMS + 5)]
    path = write_source(tmp_path, seeds=SEEDS, ttl={"rules": rules})
    lines = _validate(path, capsys)
    assert len(lines) == MAX_PROBLEMS, lines
    assert lines[-1].startswith(f"{path}: more problems not shown"), lines[-1]


def test_run_prints_the_same_problems_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ttl = {"http_timeout_s": 20, "request_deadline_s": 10, "batch_timeout_s": 30, "lease_s": 30}
    path = write_source(tmp_path, seeds=SEEDS, ttl=ttl)
    said = _validate(path, capsys)
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == said
