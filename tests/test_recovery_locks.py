"""Operator commands that put items back into the frontier take the source's lock.

Triage and ``collector deadletters retry`` turn dead pages back into queued (or done) ones. A
``collect`` run of the same source that is in progress counts those pages in its account (a full
plan tags every listed item with its run, dead ones included): changed under it, its ledger no
longer balances. So they take ``source:<name>`` as a run does, waiting up to ``locks.wait_s``.
Proved with a real ``collector run`` subprocess in progress and the real commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.frontier.sqlite import SqliteFrontier
from collector.run.locks import source_lock_name
from flows._locks import ensure_limit
from flows.collect import collect
from tests.helpers import complete_lines, summary_of, write_source
from tests.servers import free_port
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
ITEMS = 400
GONE = 3  # pages on a closed port: dead after their attempts (connect_error, recoverable)

pytestmark = pytest.mark.slow


def _env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}


def _cli(api_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COLLECTOR, *args],
        cwd=ROOT,
        env=_env(api_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


CLOSED_PORT = free_port()  # nothing listens there: connection refused at once


def _source(folder: Path, site: WorkerSite, name: str, *, items: int, wait_s: float) -> Path:
    closed = CLOSED_PORT
    return write_source(
        folder,
        name=name,
        seeds={
            "urls": [f"http://127.0.0.1:{closed}/gone/{i}.json" for i in range(GONE)],
            "template": site.url("/items/{i}.json"),
            "range": [0, items],
        },
        locks={"wait_s": wait_s},
        limits={"concurrency": 4, "per_domain_concurrency": 4},  # slow enough to be overlapped
        retry={"base_s": 0.01, "cap_s": 0.02, "max_attempts": 2},
    )


def _wait_for_records(folder: Path, at_least: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before the command could overlap it"
        if complete_lines(folder) >= at_least:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {at_least} records after 180 s")


def _summary(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "command",
    [["triage"], ["deadletters", "retry", "--all"]],
    ids=["triage", "deadletters-retry"],
)
async def test_a_command_that_requeues_waits_for_the_run_in_progress_whose_ledger_stays_exact(
    tmp_path: Path, prefect_api: str, command: list[str]
) -> None:
    name = f"recovery-lock-{command[-1].strip('-')}"
    with WorkerSite() as site:
        source = _source(tmp_path, site, name, items=5, wait_s=300)
        # the gone pages end dead, in the dead letters
        first = summary_of(await collect(source=str(source)))
        assert first["balanced"] and first["dead_lettered"] == GONE, first

        # The seed list grows: a full plan, which takes the dead pages into the run's account.
        site.set_delay(0.1)
        source = _source(tmp_path, site, name, items=ITEMS, wait_s=300)
        run = _cli(prefect_api, "run", str(source), "--batch-size", "20", "--json")
        _wait_for_records(tmp_path / "out", 40, run)
        mending = _cli(prefect_api, *command, str(source))
        out, err = run.communicate(timeout=400)
        assert run.returncode == 0, err[-3000:]
        summary = _summary(out)
        assert summary["balanced"], summary["problems"]
        assert summary["already_dead"] == GONE and summary["stored"] == ITEMS - 5, summary

        m_out, m_err = mending.communicate(timeout=300)
        assert mending.returncode == 0, m_err[-3000:]
        assert "re-enqueued 3" in m_out or "reenqueued 3" in m_out, m_out + m_err
        # It waited for the run: the run ended with its 3 dead pages dead and nothing queued,
        # and they were queued after it (before the fix they were re-enqueued under the run,
        # which fetched them again and failed its ledger).
        assert (summary["queued"], summary["dead_lettered"]) == (0, GONE), summary
        with SqliteFrontier(load_source(source).frontier_path) as frontier:
            counts = frontier.counts(name)
        assert (counts.queued, counts.dead) == (GONE, 0)

    from prefect.client.orchestration import get_client

    async with get_client() as client:
        lock = await client.read_global_concurrency_limit_by_name(source_lock_name(name))
    assert lock.active_slots == 0  # released by both


async def test_a_command_gives_up_after_the_wait_with_one_line_and_changes_nothing(
    tmp_path: Path, prefect_api: str
) -> None:
    from prefect.concurrency.asyncio import concurrency

    name = "recovery-lock-busy"
    with WorkerSite() as site:
        source = _source(tmp_path, site, name, items=2, wait_s=1)
        first = summary_of(await collect(source=str(source)))
        assert first["dead_lettered"] == GONE
        await ensure_limit(source_lock_name(name), 1)
        async with concurrency(source_lock_name(name), occupy=1, strict=True, lease_duration=60):
            ended = {
                what: _cli(prefect_api, *command, str(source)).communicate(timeout=300)[1]
                for what, command in {
                    "deadletters retry": ["deadletters", "retry", "--all"],
                    "triage": ["triage"],
                }.items()
            }
        for what, err in ended.items():
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1, err[-3000:]
            assert lines[0].startswith("collector: busy:") and f"source:{name}" in lines[0]
            assert lines[0].endswith(f"{what} changed nothing")
        listed = _cli(prefect_api, "deadletters", "list", str(source), "--json")
        entries = json.loads(listed.communicate(timeout=120)[0])
        assert [e["status"] for e in entries] == ["open"] * GONE  # nothing was re-enqueued
