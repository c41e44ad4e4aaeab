"""``collector status`` on a source whose items someone holds: alive, presumed dead, or unknown.

A holder is judged by its heartbeat in the frontier, as the runs judge one another
(``collector.run.heartbeat.judge_holders``): status must not call a run SIGKILLed a moment ago
"held" without saying when that stops counting, nor a long-silent one anything but presumed
dead (that the next run then takes its items back, whole and once, is proven in
``tests/test_lifecycle.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collector import defaults
from collector.backends import open_frontier
from collector.config import load_source
from collector.run.collection import Collection
from collector.run.heartbeat import judge_holders
from flows.cli import main
from tests.helpers import complete_lines, write_source
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]


def _said(text: str, holder: str, leased: int, *, liveness: str) -> bool:
    """The holder's line, its seconds (read a moment after --json's) as any number."""
    pattern = rf"held by {re.escape(holder)}: {leased} leased \({liveness}\)"
    return re.search(pattern, text) is not None


SECONDS = r"[0-9.]+s"


def _status(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    """The source's status as --json gives it, and as the text says it."""
    assert main(["status", str(path), "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert main(["status", str(path)]) == 0
    return status, capsys.readouterr().out


def test_a_holder_is_alive_presumed_dead_or_left_to_its_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_source(tmp_path, seeds={"urls": [f"http://h.example/{n}" for n in range(6)]})
    source = load_source(path)
    with Collection(source, run_id="planner") as run:
        run.plan()
    dead_after_s = defaults.HOLDER_DEAD_AFTER_S
    now = time.time()
    frontier = open_frontier(source)
    try:
        for holder, beat_at in (("alive", now), ("silent", now - dead_after_s - 15)):
            frontier.claim(source.name, 2, now=now, lease_s=600, holder=holder)
            frontier.beat(source.name, holder, now=beat_at)
        frontier.claim(source.name, 2, now=now, lease_s=600)  # anonymous: no heartbeat
        holders = frontier.holders(source.name)
    finally:
        frontier.close()
    verdict = judge_holders(holders, now=time.time())

    status, text = _status(path, capsys)
    by_holder = {held["holder"]: held for held in status["holders"]}
    # status says what the runs will judge: the same holders dead, no other
    dead = sorted(h for h, held in by_holder.items() if held["presumed_dead"])
    assert dead == sorted(verdict.dead) == ["silent"], by_holder
    assert all(held["dead_after_s"] == dead_after_s for held in by_holder.values())
    alive = (
        rf"last heartbeat {SECONDS} ago; its items are taken back if it stays silent "
        rf"{dead_after_s:g}s"
    )
    assert _said(text, "alive", 2, liveness=alive), text
    dead_words = rf"silent {SECONDS}: presumed dead, the next run takes its items back"
    assert _said(text, "silent", 2, liveness=dead_words), text
    assert "2 leased (no heartbeat: its items come back when their lease ends)" in text, text


def test_a_sigkilled_run_reads_as_held_then_as_presumed_dead(
    tmp_path: Path,
    prefect_api: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real ``collector run`` killed mid-batch: status first says how long its silence may
    last before it stops counting, then (the bound shortened here, not waited out) that it is
    presumed dead. Its process being gone is not checked: its pid is in Prefect, not read."""
    with WorkerSite() as site:
        site.set_delay(0.2)
        path = write_source(
            tmp_path,
            name="status-killed",
            seeds={"template": site.url("/items/{i}.json"), "range": [0, 400]},
            ttl={"lease_s": 600},
        )
        run = subprocess.Popen(
            [*COLLECTOR, "run", str(path), "--batch-size", "40", "--json"],
            cwd=ROOT,
            env={**os.environ, "PREFECT_API_URL": prefect_api},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while complete_lines(tmp_path / "out") < 40:
                assert run.poll() is None, "the run ended before it could be killed"
                assert time.monotonic() < deadline, "fewer than 40 records after 180 s"
                time.sleep(0.2)
        finally:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)

        # a bound no test outlasts: the killed run still counts as a holder
        monkeypatch.setattr(defaults, "HOLDER_DEAD_AFTER_S", 3600.0)
        status, text = _status(path, capsys)
        (held,) = status["holders"]
        assert held["leased"] > 0 and not held["presumed_dead"], held
        alive = rf"last heartbeat {SECONDS} ago; its items are taken back if it stays silent 3600s"
        assert _said(text, held["holder"], held["leased"], liveness=alive), text

        # a bound of 1 s: once its last beat is older, the dead run is called so
        monkeypatch.setattr(defaults, "HOLDER_DEAD_AFTER_S", 1.0)
        deadline = time.monotonic() + 60
        while not (seen := _status(path, capsys))[0]["holders"][0]["presumed_dead"]:
            assert time.monotonic() < deadline, seen  # a killed run beats no more
            time.sleep(0.5)
        status, text = seen
        (later,) = status["holders"]
        assert later["holder"] == held["holder"] and later["leased"] == held["leased"], later
        dead_words = rf"silent {SECONDS}: presumed dead, the next run takes its items back"
        assert _said(text, held["holder"], held["leased"], liveness=dead_words), text
