"""The `collector` command as a user runs it: subprocesses, exit codes, stdout's last line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.demo.site import FaultSite
from collector.run.summary import RunSummary
from tests.helpers import complete_lines, duplicate_keys, sink_lines, write_source

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}


def test_validate_reports_each_problem_on_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\n"
        "seeds: {urls: ['ftp://example.com/x']}\n"
        "record: {key: id}\n"
        "sink: {type: jsonl, path: out}\n"
        "ttl: {batch_timeout_s: 100, lease_s: 50, rules: [{pattern: '([', fresh_s: 1}]}\n"
        "surprise: 1\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [*COLLECTOR, "validate", str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith(str(bad)) for line in lines), lines
    text = done.stderr
    assert "seeds.urls" in text and "ftp" in text
    assert "ttl.rules[0].pattern" in text and "invalid regular expression" in text
    assert "lease_s" in text and "batch_timeout_s" in text
    assert "surprise: unknown key" in text


def test_run_json_prints_the_ledger_on_the_last_line(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    source = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 25]},
    )
    done = subprocess.run(
        [*COLLECTOR, "run", str(source), "--json", "--batch-size", "10"],
        capture_output=True,
        text=True,
        env=_env(prefect_api),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("discovered", "stored", "fresh_skipped", "expired", "dead_lettered", "queued"):
        assert name in summary
    assert summary["discovered"] == summary["stored"] == 25
    assert summary["pages_per_second"] > 0
    assert Path(summary["sink"]) == tmp_path / "out"


def test_run_with_an_invalid_source_exits_2_without_starting_prefect(tmp_path: Path) -> None:
    source = tmp_path / "s.yaml"
    source.write_text("name: x\nseeds: [\n", encoding="utf-8")
    done = subprocess.run(
        [*COLLECTOR, "run", str(source)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "invalid YAML" in done.stderr and "line" in done.stderr


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_loses_nothing_and_duplicates_nothing(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    total = 240
    source = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json?delay=0.05"), "range": [0, total]},
        limits={"concurrency": 4, "per_domain_concurrency": 4},
        ttl={"http_timeout_s": 1, "request_deadline_s": 1, "batch_timeout_s": 2, "lease_s": 3},
    )
    victim = subprocess.Popen(
        [*COLLECTOR, "run", str(source), "--json", "--batch-size", "8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(prefect_api),
    )
    deadline = time.monotonic() + 120
    try:
        while complete_lines(tmp_path / "out") < 60:
            assert victim.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.05)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    stored_before = len(sink_lines(tmp_path / "out"))
    assert 0 < stored_before < total
    # The dead run still holds source:test-items: the test server runs no repossessor to end
    # its lease, so free it as an operator would (`prefect gcl update ... --active-slots 0`).
    _release_dead_holder(prefect_api, "source:test-items")

    done = subprocess.run(
        [*COLLECTOR, "run", str(source), "--json", "--drain-wait", "30"],
        capture_output=True,
        text=True,
        env=_env(prefect_api),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["balanced"], summary["problems"]
    # The seed list is unchanged: the rerun plans incrementally and takes on what was still due
    # (queued, or leased by the dead run and revoked), not the items the dead run finished.
    assert summary["plan"] == "incremental"
    assert summary["stored"] == summary["discovered"]
    assert total - stored_before <= summary["discovered"] <= total
    assert summary["queued"] == summary["dead_lettered"] == summary["expired"] == 0
    rows = sink_lines(tmp_path / "out")
    assert duplicate_keys(rows) == []
    assert {row["id"] for row in rows} == set(range(total))


def _release_dead_holder(api_url: str, limit: str) -> None:
    update = subprocess.run(
        [sys.executable, "-m", "prefect", "gcl", "update", limit, "--active-slots", "0"],
        capture_output=True, text=True, env=_env(api_url), timeout=120,
    )  # fmt: skip
    assert update.returncode == 0, update.stdout + update.stderr


def test_deadletters_list_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from collector.config import load_source
    from collector.deadletter import DeadLetter, SqliteDeadLetterStore
    from flows.cli import main

    source_path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a.json"]})
    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    letters = [
        DeadLetter(source.name, "http://h/a", "fetch", "http_404", "HTTP 404", 1, 1.0, 2.0),
        DeadLetter(
            source.name, "http://h/b", "fetch", "http_500", "x", 3, 1, 2, cause="retries_exhausted"
        ),
        DeadLetter(source.name, "http://h/c", "parse", "parse_error", "bad json", 1, 1.0, 2.0),
    ]
    store.put(letters)
    store.close()

    assert main(["deadletters", "list", str(source_path), "--error-class", "http_500"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0].split()[:3] == ["ID", "STATUS", "STAGE"]
    assert "http://h/b" in out[1]

    assert main(["deadletters", "list", str(source_path), "--stage", "fetch", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {entry["url"] for entry in listed} == {"http://h/a", "http://h/b"}

    assert main(["deadletters", "show", str(source_path), letters[2].id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["message"] == "bad json" and shown["stage"] == "parse"
    assert main(["deadletters", "show", str(source_path), "nope"]) == 2


def _table_lines(summary: object, capsys: pytest.CaptureFixture[str]) -> dict[str, list[str]]:
    """The ledger table's rows by their first cell, as the terminal shows them."""
    from flows.cli.running import _print_summary

    assert isinstance(summary, RunSummary)
    _print_summary(summary)
    rows: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 2 and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_ledger_table_shows_every_term_of_the_equation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A seed edit's terms (unlisted, carried over, retired) and the helpers' terms are rows:
    the table adds up to its total, as the summary's equation does."""
    edited = RunSummary(
        source="s", run_id="r", discovered=10, unlisted=95, carried_over=90, retired=5,
        stored=95, stored_by_others=3, dead_lettered=2, balanced=True, requests=105,
    )  # fmt: skip
    rows = _table_lines(edited, capsys)
    assert rows["unlisted"] == ["95", "no longer listed: 90 collected again, 5 retired"]
    assert rows["retired"][0] == "5" and rows["stored_by_others"][0] == "3"
    states = ("stored", "stored_by_others", "fresh_skipped", "expired", "dead_lettered",
              "queued", "held_by_others", "retired")  # fmt: skip
    assert sum(int(rows[s][0]) for s in states) == int(rows["total"][0]) == 105

    plain = _table_lines(RunSummary(source="s", run_id="r", discovered=4, stored=4), capsys)
    assert "unlisted" not in plain and "retired" not in plain and "stored_by_others" not in plain


def test_a_run_that_only_expired_items_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli.running import _print_summary

    _print_summary(RunSummary(source="s", run_id="r", discovered=90, expired=90))
    out = capsys.readouterr().out
    assert "nothing fetched: 90 expired in the queue" in out, out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "s.yaml", "--max-items", "-5"],
        ["run", "s.yaml", "--batch-size", "0"],
        ["triage", "s.yaml", "--limit", "0"],
        ["deadletters", "list", "s.yaml", "--limit", "x"],
    ],
)
def test_a_bad_count_is_refused_with_the_subcommands_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    command = " ".join(argv[: 2 if argv[0] == "deadletters" else 1])
    assert err.startswith(f"usage: collector {command} "), err  # not the top-level usage
    assert f"argument {argv[-2]}: " in err and ("at least 1" in err or "whole number" in err)
