"""Every way a run ends is an ending the ledger knows: Ctrl-C, SIGTERM, SIGKILL then a rerun.

Each run is a real ``collector run`` subprocess in its own process group (as a terminal's
foreground job), signalled with ``os.killpg`` / ``os.kill`` mid-run, against the session's
Prefect server and a local site that answers slowly enough to be caught mid-batch. What is
checked is what a user relies on: the exit code, one line saying what happened (no pages of
client errors), the summary marked interrupted and balanced, and a rerun right after that
completes the source exactly (every record once, nothing left queued).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import complete_lines, duplicate_keys, sink_lines, write_source
from tests.worker_site import WorkerSite

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
ITEMS = 400
NOT_NULL_ID = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}

pytestmark = pytest.mark.slow


def _source(folder: Path, site: WorkerSite, name: str, *, validated: bool = False) -> Path:
    """The site's items; ``validated`` adds a suite, so the run has a GX worker process (a
    child in the run's process group unless it is put elsewhere: a Ctrl-C reaches it too)."""
    sections: dict[str, Any] = {}
    if validated:
        suite = {"name": "items", "expectations": [NOT_NULL_ID]}
        (folder / "suite.json").write_text(json.dumps(suite), encoding="utf-8")
        sections["validation"] = {"suite": "suite.json"}
    return write_source(
        folder,
        name=name,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, ITEMS]},
        locks={"wait_s": 150},
        ttl={"lease_s": 600},
        **sections,
    )


def _no_traceback(err: str) -> None:
    """A stop is not a crash: no process of the run (the GX worker included) prints one."""
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def _start(source: Path, api_url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PREFECT_API_URL": api_url}
    return subprocess.Popen(
        [*COLLECTOR, "run", str(source), "--batch-size", "40", "--json", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )


def _wait_for_records(folder: Path, at_least: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be interrupted: {proc.stderr}")
        if complete_lines(folder) >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} records after 180 s")


def _wait_for_fetches(site: WorkerSite, at_least: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be interrupted: {proc.stderr}")
        if len(site.fetches()) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} pages fetched after 180 s")


def _summary(stdout: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return summary


def _rerun_completes_the_source(source: Path, folder: Path, api_url: str) -> dict[str, Any]:
    rerun = _start(source, api_url)
    out, err = rerun.communicate(timeout=400)
    assert rerun.returncode == 0, err
    summary = _summary(out)
    assert summary["balanced"], summary["problems"]
    assert summary["queued"] == 0 and summary["held_by_others"] == 0, summary
    rows = sink_lines(folder)
    assert duplicate_keys(rows) == []
    assert sorted(int(r["id"]) for r in rows) == list(range(ITEMS))
    return summary


@pytest.mark.parametrize(
    ("signum", "code", "to_group"),
    [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)],
    ids=["ctrl-c-to-the-group", "sigterm"],
)
def test_a_signal_stops_the_run_gracefully_and_a_rerun_completes_exactly(
    tmp_path: Path, prefect_api: str, signum: signal.Signals, code: int, to_group: bool
) -> None:
    with WorkerSite() as site:
        site.set_delay(0.05)
        # the Ctrl-C case validates, so the terminal's SIGINT also reaches a GX worker
        source = _source(tmp_path, site, f"lifecycle-{signum.name.lower()}", validated=to_group)
        proc = _start(source, prefect_api)
        # Fetched, not written: the run fetches ahead of its settles (up to SETTLE_BACKLOG
        # batches, two batches fetching at once), so by 80 records written under load every
        # page had been fetched and the stop found nothing queued (a full run, 2026-12-06).
        _wait_for_fetches(site, 80, proc)
        # Slow the site down (1 s a page, under the 2 s HTTP timeout: no retry) just before the
        # signal, so the run cannot finish the remaining 320 items while a loaded machine takes
        # seconds to deliver the stop (at 0.05 s a page, a CI run under load 12 drained them
        # all and ended with nothing queued; at 1 s it would need ~20 s).
        site.set_delay(1.0)
        sent = time.monotonic()
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
        print(f"{signum.name}: exited {proc.returncode} {took:.1f} s after the signal")

        assert proc.returncode == code, err
        lines = [line for line in err.splitlines() if line.strip()]
        # said once, by the command (the flow's own lines of it are for the UI)
        assert sum(f"interrupted by {signum.name}" in line for line in lines) == 1, err
        assert len(lines) <= 5, "a stopped run says what happened in a line or two:\n" + err
        _no_traceback(err)
        summary = _summary(out)
        assert summary["interrupted"] == signum.name and summary["ending"] == "stopped"
        assert summary["balanced"], summary["problems"]
        assert summary["held_by_others"] == 0  # every lease it held went back
        assert summary["queued"] > 0 and summary["stored"] > 0
        # nothing counted as an attempt or a retry for the stop
        assert summary["retried"] == 0 and summary["dead_lettered"] == 0

        site.set_delay(0)
        rerun = _rerun_completes_the_source(source, tmp_path / "out", prefect_api)
        assert rerun["stored"] == ITEMS - summary["stored"]


def test_a_second_ctrl_c_exits_at_once_with_one_line_and_no_traceback(
    tmp_path: Path, prefect_api: str
) -> None:
    """The second SIGINT ends the run process at once (os._exit); its GX worker, still busy or
    waiting on the pipe, must go quietly too (stderr is read until every holder of it exits)."""
    with WorkerSite() as site:
        site.set_delay(0.2)
        source = _source(tmp_path, site, "lifecycle-twice", validated=True)
        proc = _start(source, prefect_api)
        _wait_for_records(tmp_path / "out", 40, proc)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.1)  # the first is being handled, the graceful stop not over
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "stopped at once" in err, err
        _no_traceback(err)


def test_sigkill_then_rerun_takes_back_the_dead_runs_leases_at_once(
    tmp_path: Path, prefect_api: str
) -> None:
    """A run killed mid-batch holds leases for lease_s (600 s by default); the rerun revokes
    them as soon as the dead holder's heartbeat is stale, instead of leaving them queued."""
    with WorkerSite() as site:
        site.set_delay(0.2)
        source = _source(tmp_path, site, "lifecycle-sigkill")
        proc = _start(source, prefect_api)
        _wait_for_records(tmp_path / "out", 40, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        site.set_delay(0)
        rerun = _rerun_completes_the_source(source, tmp_path / "out", prefect_api)
        assert rerun["leases_reclaimed"] > 0  # the dead run's leases, revoked, not waited out


def test_a_rerun_after_sigkill_takes_the_lock_at_once_and_marks_the_dead_run_crashed(
    tmp_path: Path, prefect_api: str
) -> None:
    """The killed run's process is gone from this machine, so the rerun knows its holder is
    dead without waiting out the heartbeat bound: with ``--lock-wait 0`` (one try, no wait)
    it takes the lock, revokes the dead run's leases, ends exact, and the dead run's flow run,
    left RUNNING by the SIGKILL, is Crashed with a message saying why."""
    with WorkerSite() as site:
        site.set_delay(0.2)
        source = _source(tmp_path, site, "lifecycle-at-once")
        proc = _start(source, prefect_api)
        _wait_for_records(tmp_path / "out", 40, proc)
        dead_run = _flow_run_of(proc.pid, prefect_api)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        site.set_delay(0)
        rerun = _start(source, prefect_api, "--lock-wait", "0")
        out, err = rerun.communicate(timeout=400)
        assert rerun.returncode == 0, err  # busy would be exit 3
        assert "held by another run" not in err, err  # it never waited
        summary = _summary(out)
        assert summary["balanced"] and summary["queued"] == 0, summary
        assert summary["leases_reclaimed"] > 0, summary
        rows = sink_lines(tmp_path / "out")
        assert duplicate_keys(rows) == []
        assert sorted(int(r["id"]) for r in rows) == list(range(ITEMS))
    state = _flow_run_state(dead_run, prefect_api)
    assert state["type"] == "CRASHED", state
    assert "is gone" in state["message"] and "no heartbeat" in state["message"], state


def _flow_run_of(pid: int, api_url: str) -> str:
    """The flow run id the run in process ``pid`` holds the lock with (its environment has
    no id; the lock's beat Variable, written by that pid, has)."""
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{api_url}/variables/filter",
            data=json.dumps({"variables": {"name": {"like_": "collector-lock-"}}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            for variable in json.loads(response.read()):
                value = variable["value"]
                if isinstance(value, dict) and value.get("pid") == pid:
                    return str(value["holder"])
        time.sleep(0.5)
    raise AssertionError(f"no lock beat of pid {pid} within 60 s")


def _flow_run_state(run_id: str, api_url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{api_url}/flow_runs/{run_id}", timeout=30) as response:
        state: dict[str, Any] = json.loads(response.read())["state"]
    return state


def _importing(pid: int, folder: Path) -> bool:
    """The command is still importing its engine (aiohttp's parser is being loaded)."""
    return "aiohttp/_http_parser" in Path(f"/proc/{pid}/maps").read_text()


def _reached_its_stores(pid: int, folder: Path) -> bool:
    """The command's preflight has opened the source's stores (before Prefect starts)."""
    return (folder / ".collector" / "frontier.db").exists()


@pytest.mark.parametrize("moment", [_importing, _reached_its_stores], ids=lambda f: f.__name__)
def test_an_early_sigint_stops_a_run_started_with_sigint_ignored(
    tmp_path: Path, prefect_api: str, moment: Any
) -> None:
    """A shell's background job (``collector run src.yaml &``) starts with SIGINT ignored, and
    Python leaves it so. The console script records a SIGINT from its first line
    (flows/command.py) and the command hands it to the run's stop request, so a SIGINT while
    it imports, or while it reaches its stores, still stops the run: said once, nothing lost."""
    with WorkerSite() as site:
        source = _source(tmp_path, site, f"lifecycle-early{moment.__name__}")
        script = str(Path(sys.executable).parent / "collector")  # what a user starts
        ignoring = (
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )  # as bash starts a background job: SIG_IGN survives the exec
        env = {**os.environ, "PREFECT_API_URL": prefect_api}
        proc = subprocess.Popen(
            [sys.executable, "-c", ignoring, script, "run", str(source), "--json"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not moment(proc.pid, tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)

        assert proc.returncode == 130, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert sum("interrupted by SIGINT" in line for line in lines) == 1, err
        _no_traceback(err)
        stored = 0
        if out.strip():  # the flow had started: its summary, stopped and exact
            summary = _summary(out)
            assert summary["interrupted"] == "SIGINT" and summary["balanced"], summary
            stored = summary["stored"]
        assert stored < ITEMS
        rerun = _rerun_completes_the_source(source, tmp_path / "out", prefect_api)
        assert rerun["stored"] == ITEMS - stored
