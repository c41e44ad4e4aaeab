"""The terminal tells the truth and helps (issues 19 and 20): each test runs the real command,
as a subprocess, and reads what a user would read."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.deadletter import DeadLetter, SqliteDeadLetterStore
from collector.deadletter.base import Stage, dead_letter_id
from collector.demo.site import FaultSite
from collector.sinks.base import SinkRecord
from collector.sinks.jsonl import JsonlSink
from tests.helpers import summary_of, write_source

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]


def env(api_url: str | None = None, **changes: str | None) -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(ROOT)}
    if api_url:
        out["PREFECT_API_URL"] = api_url
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def collector(*args: str, api: str | None = None, stdin: Any = subprocess.DEVNULL,
              **changes: str | None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [*COLLECTOR, *args], capture_output=True, text=True, cwd=ROOT, stdin=stdin,
        env=env(api, **changes), timeout=300,
    )  # fmt: skip


def put_letters(path: Path, letters: list[tuple[str, Stage, str]], age_s: float = 60) -> list[str]:
    """Dead letters (url, stage, error class) for the source at ``path``; their ids."""
    source = load_source(path)
    store = SqliteDeadLetterStore(source.deadletter_path, archive=source.deadletter_archive_path)
    seen = time.time() - age_s
    entries = [
        DeadLetter(source.name, url, stage, error, f"{error} at {url}", 1, seen, seen)
        for url, stage, error in letters
    ]
    try:
        store.put(entries)
    finally:
        store.close()
    return [e.id for e in entries]


def write_batches(path: Path, sizes: list[int]) -> list[str]:
    source = load_source(path)
    sink = JsonlSink(source.sink_path, source=source.name)
    ids, n = [], 0
    try:
        for token, size in enumerate(sizes, 1):
            batch = f"run-a:{token}"
            sink.write([SinkRecord(str(n + i), {"id": n + i, "price": 5.0 * (n + i)}, "u")
                        for i in range(size)], token=token, batch_id=batch)  # fmt: skip
            n += size
            ids.append(batch)
    finally:
        sink.close()
    return ids


# --- 19.1 backlog -----------------------------------------------------------------------------
def test_backlog_command_and_the_plain_python_call_both_sample(
    tmp_path: Path, prefect_api: str
) -> None:
    path = write_source(
        tmp_path, name=f"bl-{time.time_ns()}", seeds={"urls": ["http://h.example/0"]}
    )
    done = collector("backlog", str(path), "--json", api=prefect_api)
    assert done.returncode == 0, done.stderr
    [sample] = json.loads(done.stdout.strip().splitlines()[-1])
    assert sample["level"] == "ok" and "depth" in sample
    text = collector("backlog", str(path), api=prefect_api)
    assert text.returncode == 0 and "depth 0 / capacity" in text.stdout, text.stderr
    plain = subprocess.run(
        [sys.executable, "-c", "from flows.backlog import backlog_monitor; "
         f"print(backlog_monitor(sources=[{str(path)!r}]))"],
        capture_output=True, text=True, cwd=ROOT, env=env(prefect_api), timeout=300,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "never awaited" not in plain.stderr
    assert "'level': 'ok'" in plain.stdout


# --- 19.2 / 20.5 compensate, batches ----------------------------------------------------------
def test_compensate_refuses_an_unknown_batch_and_records_nothing(
    tmp_path: Path, prefect_api: str
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]})
    before = time.time()
    first, second = write_batches(path, [2, 3])
    after = time.time()
    ledger = load_source(path).ledger_path

    bogus = collector("compensate", str(path), "--batch", "garbage", "--reason", "x")
    assert bogus.returncode == 1
    assert "batch garbage: not in" in bogus.stderr and "collector batches" in bogus.stderr
    assert "compensated" not in bogus.stdout
    assert not ledger.exists() or ledger.read_text() == ""  # no bogus ledger line

    listed = collector("batches", str(path), "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    assert [(r["batch_id"], r["run"], r["records"]) for r in rows] == [
        (first, "run-a", 2), (second, "run-a", 3)]  # fmt: skip
    for row in rows:  # when each batch was written: epoch for scripts, UTC to read
        assert before <= row["written"] <= after, (before, row, after)
        stamp = datetime.fromtimestamp(row["written"], UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        assert row["written_at"] == stamp
    table = collector("batches", str(path))
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["BATCH", "RUN", "TOKEN", "RECORDS", "WRITTEN", "(UTC)"]
    assert lines[1].split()[-2:] == rows[0]["written_at"].split()
    assert table.stderr.startswith("2 batches in ")

    dry = collector("compensate", str(path), "--batch", second, "--dry-run")
    assert dry.returncode == 0 and "would remove 3 records" in dry.stdout
    assert "nothing changed" in dry.stdout and not ledger.exists()

    no_reason = collector("compensate", str(path), "--batch", second)  # stdin: not a terminal
    assert no_reason.returncode == 2 and "needs a reason" in no_reason.stderr
    assert not ledger.exists()

    done = collector("compensate", str(path), "--batch", second, "--reason", "bad prices",
                     api=prefect_api,  # the compensate flow runs on it
                     USER=None, LOGNAME=None, LNAME=None, USERNAME=None)  # fmt: skip
    assert done.returncode == 0 and "3 records removed" in done.stdout
    [line] = ledger.read_text().splitlines()
    entry = json.loads(line)
    assert entry["reason"] == "bad prices" and entry["by"]  # never empty


# --- 19.3 refused seeds -----------------------------------------------------------------------
def test_a_local_site_without_the_flag_is_explained_and_healed(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    seeds = {"template": site.url("/items/{i}.json"), "range": [0, 20]}
    path = write_source(tmp_path, seeds=seeds, allow_private_networks=False)
    checked = collector("validate", str(path))
    assert checked.returncode == 0
    assert "warning: 20 of the first 20 seed URLs would be refused" in checked.stderr
    assert "allow_private_networks" in checked.stderr

    run = collector("run", str(path), api=prefect_api)
    assert run.returncode == 1, run.stderr[-2000:]  # a source that can collect nothing failed
    assert "every seed URL of test-items was refused at plan (20)" in run.stderr
    assert "refused:      20 seed URLs before fetching" in run.stdout
    assert "allow_private_networks" in run.stdout
    assert "nothing fetched: 20 refused at plan" in run.stdout

    write_source(tmp_path, seeds=seeds, allow_private_networks=True)
    from flows.collect import collect

    summary = summary_of(asyncio.run(collect(source=str(path))))  # the flow, in this process
    assert (summary["stored"], summary["replanned"]) == (20, 20)
    assert summary["deadletter_reasons"] == {}
    listed = collector("deadletters", "list", str(path), "--json", "--status", "resolved")
    resolutions = {(e["resolution_kind"], e["resolution"]) for e in json.loads(listed.stdout)}
    assert resolutions == {("reenqueued", "re-planned: the URL policy allows it now")}


# --- 19.4 progress ----------------------------------------------------------------------------
def test_progress_starts_with_prefect_and_stays_as_the_last_line(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    import pty
    import re
    import select

    path = write_source(tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 30]})
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on a terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [*COLLECTOR, "run", str(path), "--batch-size", "10"],
                  env(prefect_api))  # fmt: skip
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    assert "starting Prefect" in text
    assert text.index("starting Prefect") < text.index("collect ")
    frames = [f for f in re.split(r"[\r\n]", text) if "collect" in f and "/30" in f]
    # left on screen (what the terminal got at the end, if not: a loaded CI once saw no final
    # frame, its last one at 20/30, and exit 0; the tail says what came instead)
    assert frames and "30/30" in frames[-1] and "collected" in frames[-1], text[-3000:]
    assert text.index("collected") < text.index("Ledger of")


def test_the_engine_reports_every_item_as_its_fetch_ends(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    from flows.collect import listening, run_collect

    path = write_source(tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 25]})
    events: list[tuple[str, dict[str, Any]]] = []
    with listening(lambda event, data: events.append((event, data))):
        summary = run_collect(str(path), batch_size=10, max_items=None, drain_wait_s=5)
    assert summary.stored == 25
    fetched = [data for event, data in events if event == "fetched"]
    assert len(fetched) == 25 and {d["status"] for d in fetched} == {"ok"}
    order = [event for event, _ in events if event in ("fetched", "batch")]
    assert order.index("fetched") < order.index("batch")  # items before their batch settles


def test_a_runs_own_listeners_hear_that_run_only(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    """``run_collect(listeners=...)`` is per run: the flow and its tasks tell them (they run in
    the caller's context), and the next run does not."""
    from flows.collect import _listeners, run_collect

    path = write_source(tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 12]})
    mine: list[str] = []
    summary = run_collect(
        str(path), batch_size=5, max_items=None, drain_wait_s=5,
        listeners=[lambda event, data: mine.append(event)],
    )  # fmt: skip
    assert summary.stored == 12 and not _listeners()  # nothing left behind in this context
    assert mine.count("fetched") == 12 and mine.count("batch") == 3 and "planned" in mine
    told = len(mine)
    run_collect(str(path), batch_size=5, max_items=None, drain_wait_s=5)
    assert len(mine) == told  # a later run without them tells them nothing


# --- 19.5 / 20.4 deadletters list and show ----------------------------------------------------
def test_deadletters_list_is_a_table_with_a_json_twin_and_says_what_it_hides(
    tmp_path: Path,
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]})
    ids = put_letters(path, [(f"http://h.example/{n}", "fetch", "http_404") for n in range(5)])
    listed = collector("deadletters", "list", str(path))
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "STATUS", "STAGE", "ERROR"] and "MESSAGE" in lines[0]
    assert len(lines) == 6 and "http_404 at http://h.example/" in listed.stdout
    assert "1970" not in listed.stdout and "Z " in lines[1]  # a date, not an epoch float
    as_json = json.loads(collector("deadletters", "list", str(path), "--json").stdout)
    assert sorted(e["id"] for e in as_json) == sorted(ids) and "first_seen_at" in as_json[0]

    cut = collector("deadletters", "list", str(path), "--limit", "2")
    assert len(cut.stdout.splitlines()) == 3
    assert "showing the first 2 entries; more match" in cut.stderr

    typo = collector("deadletters", "list", str(path), "--stage", "fetchx")
    assert typo.returncode == 2 and "invalid choice: 'fetchx'" in typo.stderr

    none = collector("deadletters", "list", str(path), "--error-class", "http_500")
    assert none.returncode == 0 and none.stdout == ""
    assert "no dead letters of test-items match" in none.stderr
    assert "error classes of open entries: http_404" in none.stderr

    target = ids[0]
    unique = next(n for n in range(4, 24) if sum(i.startswith(target[:n]) for i in ids) == 1)
    shown = collector("deadletters", "show", str(path), target[: max(unique, 4)])
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == target
    a, b = _two_ids_sharing_a_prefix("test-items", 4)
    put_letters(path, [(a, "fetch", "timeout"), (b, "fetch", "timeout")])
    shared = dead_letter_id("test-items", a, "fetch", "timeout")[:4]
    ambiguous = collector("deadletters", "show", str(path), shared)
    assert ambiguous.returncode == 2 and "is ambiguous" in ambiguous.stderr

    source = load_source(path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        for entry in store.list(source=source.name, limit=1000):
            assert store.escalate(entry.id, "a person looks")
    finally:
        store.close()
    moved = collector("deadletters", "list", str(path))
    assert moved.stdout == "" and "--status review" in moved.stderr


def _two_ids_sharing_a_prefix(source: str, length: int) -> tuple[str, str]:
    """Two URLs whose dead letters' ids start alike (found by trying, not by luck)."""
    seen: dict[str, str] = {}
    for n in range(1_000_000):
        url = f"http://h.example/p{n}"
        prefix = dead_letter_id(source, url, "fetch", "timeout")[:length]
        if prefix in seen:
            return seen[prefix], url
        seen[prefix] = url
    raise AssertionError("no shared prefix")


# --- 19.6 audit -------------------------------------------------------------------------------
def test_audit_text_counts_what_the_json_counts(
    tmp_path: Path, prefect_api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = {"name": "s", "expectations": [{"type": "expect_column_values_to_be_between",
             "kwargs": {"column": "price", "max_value": 12}}]}  # fmt: skip
    (tmp_path / "suite.json").write_text(json.dumps(suite), encoding="utf-8")
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]},
                        validation={"suite": "suite.json"})  # fmt: skip
    write_batches(path, [2, 3])  # prices 0, 5 | 10, 15, 20: 2 rows fail, both in batch 2
    done = collector("audit", str(path), "--json", api=prefect_api)  # the audit flow runs on it
    assert done.returncode == 0, done.stderr
    as_json = json.loads(done.stdout.strip().splitlines()[-1])
    assert [b["rows_failing"] for b in as_json["batches"]] == [0, 2]
    # the text the command prints without --json, from that same report (one audit, not two:
    # each is a Prefect run and a GX worker; tests/test_compensate_flow.py runs the text one)
    from flows.cli.recovery import _print_audit

    _print_audit(as_json, dry_run=False)
    text = capsys.readouterr().out
    assert "2 records in 1 batch failing row-level expectations" in text
    assert "0 failing table-level expectations" in text
    assert "recorded in" not in text  # nothing was removed, nothing recorded


# --- 19.7 / 20.7 messages keep what the user wrote --------------------------------------------
def test_messages_keep_backslashes_and_spaces(tmp_path: Path) -> None:
    path = write_source(
        tmp_path, seeds={"urls": ["http://h.example/0"]},
        ttl={"rules": [{"pattern": r"/items/(\d+\.json$", "fresh_s": 1}]},
    )  # fmt: skip
    done = collector("validate", str(path))
    assert done.returncode == 2
    assert r"'/items/(\d+\.json$'" in done.stderr and "\\\\d" not in done.stderr

    from collector.settle.suite import show

    assert show("  tools ") == "'  tools '"  # what row messages show for a value


# --- 19.8 no-op run ---------------------------------------------------------------------------
def test_a_second_run_says_it_had_nothing_to_fetch(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    path = write_source(
        tmp_path, seeds={"template": site.url("/missing/{i}.json"), "range": [0, 4]}
    )
    from flows.collect import collect

    summary_of(asyncio.run(collect(source=str(path))))  # the first run: setup, in this process
    second = collector("run", str(path), api=prefect_api)
    assert second.returncode == 0, second.stderr[-2000:]
    # the seed list is unchanged: an incremental plan, nothing due (dead pages are triage's)
    assert "nothing was due: the seed list is unchanged" in second.stdout
    assert "a no-op run, not a failure" in second.stdout


# --- 19.9 help --------------------------------------------------------------------------------
def test_every_command_and_option_has_help_text() -> None:
    import argparse

    from flows.cli import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{where} {name} (no summary)")
                    walk(sub, f"{where} {name}")
                continue
            if not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "collector")
    assert missing == []
    top = collector("--help")
    assert "``" not in top.stdout and "Collect web data" in top.stdout
    assert "Exit codes" in top.stdout


def test_the_help_walk_finds_an_option_without_help() -> None:
    """The walk above can fail: an option without help is reported."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--bare")
    assert [a for a in parser._actions if not a.help and a.option_strings != ["-h", "--help"]]


# --- 19.10 / 19.11 Prefect's output -----------------------------------------------------------
def test_console_quiet_but_the_ui_gets_the_logs(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    path = write_source(tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 5]})
    done = collector("run", str(path), "--json", api=prefect_api, PREFECT_LOGGING_LEVEL=None)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "INFO" not in done.stderr and "EventsWorker" not in done.stderr
    run_id = json.loads(done.stdout.strip().splitlines()[-1])["run_id"]

    async def logs() -> list[str]:
        async with get_client() as client:
            found = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return [log.message for log in found]

    messages = asyncio.run(logs())
    assert any(m.startswith("planned test-items") for m in messages), messages


def test_prefect_background_services_only_speak_up_for_errors() -> None:
    import logging

    from flows.cli._common import _prefect_environment

    # As Prefect leaves it (its own level, whatever other tests did to the root logger):
    logging.getLogger("EventsWorker").setLevel(logging.WARNING)
    assert logging.getLogger("EventsWorker").isEnabledFor(logging.WARNING)  # it would speak
    _prefect_environment()
    assert not logging.getLogger("EventsWorker").isEnabledFor(logging.WARNING)
    assert os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"


# --- 19.12 demo -------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_says_what_its_dead_letters_say_and_cleans_up(
    tmp_path: Path, prefect_api: str
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = collector("demo", api=prefect_api, TMPDIR=str(temp))
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "no answer within its 1 s read timeout" in done.stdout
    assert "after 1 s" in done.stdout  # the timeout's dead letter: the same second
    assert list(temp.glob("collector-demo-*")) == []


# --- 20.2 unset variable ----------------------------------------------------------------------
def test_an_unset_variable_is_a_warning_then_one_line(tmp_path: Path) -> None:
    headers = {"Authorization": "Bearer ${env:SHOP_TOKEN}"}
    path = write_source(
        tmp_path, seeds={"urls": ["http://h.example/0"]}, limits={"headers": headers}
    )
    checked = collector("validate", str(path), SHOP_TOKEN=None)
    assert checked.returncode == 0
    assert "warning: limits.headers.Authorization: environment variable SHOP_TOKEN" in (
        checked.stderr
    )
    run = collector("run", str(path), SHOP_TOKEN=None)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"{path}: limits.headers.Authorization: environment variable SHOP_TOKEN is not set"
    ]


# --- 20.3 triage --dry-run --------------------------------------------------------------------
def test_triage_dry_run_says_so_and_its_lines_agree(tmp_path: Path, prefect_api: str) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]})
    put_letters(path, [(f"http://h.example/{n}", "fetch", "http_404") for n in range(3)])
    dry = collector("triage", str(path), "--dry-run", api=prefect_api)
    assert dry.returncode == 0, dry.stderr[-2000:]
    first, second = dry.stdout.strip().splitlines()[-2:]
    assert "dry run, nothing changed" in first and "would have" in first
    assert "escalated 3" in first
    assert second.startswith("balance of the store, unchanged by the dry run:")
    assert "open 3" in second


# --- 20.6 pipes -------------------------------------------------------------------------------
def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]})
    put_letters(path, [(f"http://h.example/{n}", "fetch", "http_404") for n in range(3000)])
    for command in ("schema", f"deadletters list {path} --limit 3000"):
        done = subprocess.run(
            f"{sys.executable} -m flows.cli {command} | head -n 1",
            shell=True, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=120,
        )  # fmt: skip
        assert done.returncode == 0
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
        assert len(done.stdout.splitlines()) == 1


# --- 16.4 one resolver ------------------------------------------------------------------------
def test_every_command_takes_a_block_name_like_the_flows(tmp_path: Path, prefect_api: str) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://h.example/0"]})
    name = f"cli-{time.time_ns()}"
    missing = collector("validate", f"block:{name}", api=prefect_api)
    assert missing.returncode == 2 and f"block '{name}'" in missing.stderr
    assert "file not found" not in missing.stderr
    saved = collector("blocks", "save", name, str(path), api=prefect_api)
    assert saved.returncode == 0, saved.stderr[-2000:]
    checked = collector("validate", f"block:{name}", api=prefect_api)
    assert checked.returncode == 0 and "ok (test-items: 1 seed URL," in checked.stdout
    listed = collector("deadletters", "list", f"block:{name}", api=prefect_api)
    assert listed.returncode == 0 and "no dead letters of test-items match" in listed.stderr


def test_the_block_prefixes_are_the_blocks_own() -> None:
    from blocks.source import BLOCK_PREFIXES
    from flows import sources

    assert sources.BLOCK_PREFIXES == BLOCK_PREFIXES


# --- records with the same key from two pages ---------------------------------------------------
def test_records_replaced_by_a_later_one_with_the_same_key_are_counted_and_named(
    tmp_path: Path, site: FaultSite, prefect_api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two pages yielding the same record key: the sink keeps one record per key (unchanged),
    but the run counts the replaced records and says which key and pages, once."""
    urls = [site.url(f"/items/{i}.json") for i in range(4)]
    urls += [site.url("/items/1.json?copy=a"), site.url("/items/2.json?copy=b")]  # ids 1, 2
    path = write_source(tmp_path, seeds={"urls": urls})
    run = collector("run", str(path), "--json", api=prefect_api)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["stored"], summary["records_in_sink"]) == (6, 4)
    assert summary["key_collisions"] == 2 and summary["balanced"]
    example = summary["key_collision"]
    assert example["key"] in ("1", "2")
    assert {example["first_url"], example["later_url"]} in (
        {urls[1], urls[4]},
        {urls[2], urls[5]},
    )
    warnings = [line for line in run.stderr.splitlines() if "same key" in line]
    assert len(warnings) == 1, run.stderr
    assert f"key '{example['key']}'" in warnings[0]
    assert example["first_url"] in warnings[0] and example["later_url"] in warnings[0]

    from collector.run.summary import RunSummary
    from flows.cli.running import _print_summary

    _print_summary(RunSummary.from_dict(summary))
    table = capsys.readouterr().out
    assert "key collisions: 2 records replaced an earlier record of this run" in table
    assert f"e.g. key '{example['key']}'" in table
