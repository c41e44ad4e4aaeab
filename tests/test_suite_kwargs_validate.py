"""`collector validate` runs the run's own GX kwargs check on a suite (file or inline), so an
expectation missing a required kwarg exits 2 with one line before any fetch, instead of the run
failing after fetching with a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.config import load_source, suite_kwargs_problems
from collector.demo.scenario import SUITE
from collector.demo.site import FaultSite
from flows.cli import main
from tests.helpers import write_source

ROOT = Path(__file__).resolve().parents[1]
SEEDS = {"urls": ["http://127.0.0.1:9/items/1.json"]}
MISSING_COLUMN = {
    "name": "broken",
    "expectations": [
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {}},
    ],
}
WHERE = "expectations[1] (expect_column_values_to_not_be_null): invalid kwargs: column: "


def test_a_suite_file_missing_a_required_kwarg_fails_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(MISSING_COLUMN), encoding="utf-8")
    path = write_source(tmp_path, seeds=SEEDS, validation={"suite": "suite.json"})
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{path}: validation.suite: {suite}: {WHERE}"), line
    assert "ok" not in captured.out


def test_an_inline_suite_missing_a_required_kwarg_fails_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_source(tmp_path, seeds=SEEDS, validation={"suite": MISSING_COLUMN})
    assert main(["validate", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{path}: validation.suite: (inline suite): {WHERE}"), line
    assert not (tmp_path / ".collector").exists()  # validate writes nothing


def test_a_good_suite_has_no_kwargs_problem(tmp_path: Path) -> None:
    source = load_source(write_source(tmp_path, seeds=SEEDS, validation={"suite": SUITE}))
    assert suite_kwargs_problems(source, "x") == []


def test_a_run_with_such_a_suite_stops_before_fetching_with_one_line(
    tmp_path: Path, prefect_api: str, site: FaultSite
) -> None:
    """The run's GX worker says so in its first frame: the run ends before any claim."""
    path = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 5]},
        validation={"suite": MISSING_COLUMN},
        allow_private_networks=True,
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert WHERE in ran.stderr.strip().splitlines()[-1], ran.stderr[-3000:]
    assert site.requests == []  # nothing was fetched
