"""``collector validate`` says every problem of a source in one go, in the file's order: the
model's, the suite file's and GX's verdict on its kwargs, with the key a typo probably meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from collector.config.report import in_file_order, key_lines

ROOT = Path(__file__).resolve().parents[1]

SOURCE = """\
name: shop
seeds: {urls: ["http://127.0.0.1:9/a.json"]}
record: {key: id}
sink: {type: jsonl, pat: out}
ttl:
  default_fresh_s: 60
  rules:
    - {pattern: "([a", fresh_s: 10}
priority: {weight: 50}
limits:
  concurency: 8
validation:
  suite: suite.json
allow_private_networks: true
"""

SUITE = {
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_not_be_nul", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"colum": "id"}},
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "t", "regex": "(["}},
    ]
}


def test_every_problem_at_once_in_file_order(tmp_path: Path) -> None:
    (tmp_path / "suite.json").write_text(json.dumps(SUITE))
    source = tmp_path / "shop.yaml"
    source.write_text(SOURCE)
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "validate", str(source)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLLECTOR_CACHE_DIR": str(tmp_path / "c")},
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    keys = [line.split(": ")[1] for line in lines]
    assert keys == [
        "sink.path",  # line 4: `path` is missing...
        "sink.pat",  # ...and `pat` unknown
        "ttl.rules[0].pattern",  # line 8
        "priority.weight",  # line 9
        "limits.concurency",  # line 11
        "validation.suite",  # line 13, three of them, in the suite's order
        "validation.suite",
        "validation.suite",
    ], lines
    assert "did you mean 'path'?" in lines[1]
    assert "did you mean 'concurrency'?" in lines[4]
    assert "expectations[1]" in lines[5] and "did you mean" in lines[5]
    assert "expectations[2]" in lines[6] and "colum: extra fields not permitted" in lines[6]
    assert "expectations[3]" in lines[7] and "invalid regex" in lines[7]


def test_key_lines_name_every_key_and_item() -> None:
    lines = key_lines(SOURCE)
    assert lines["name"] == 1
    assert lines["sink.pat"] == 4
    assert lines["ttl.rules[0]"] == lines["ttl.rules[0].pattern"] == 8
    assert lines["validation.suite"] == 13


def test_a_missing_key_sorts_at_its_parent_and_the_file_first(tmp_path: Path) -> None:
    source = tmp_path / "s.yaml"
    source.write_text(SOURCE)
    label = str(source)
    problems = [
        f"{label}: limits.concurrency: x",  # not in the file: at `limits` (line 10)
        f"{label}: ttl.lease_s: required key is missing",  # at `ttl` (line 5)
        f"{label}: the file must be a mapping",  # the whole file: first
        f"{label}: ttl.rules[0].pattern: y",
    ]
    assert in_file_order(problems, source) == [
        problems[2],
        problems[1],
        problems[3],
        problems[0],
    ]
