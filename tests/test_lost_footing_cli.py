"""`collector run` (a real subprocess) that loses its source lock exits 4 and says so.

The lock is taken away with real parts: its Prefect lease released by id (as a waiter that
judged the run dead does), or the Prefect API made unreachable for the run (a TCP relay in front
of the session's server that refuses and cuts every connection, then comes back). An outage
shorter than the lock's margin is ridden out (the run ends Completed and exact); a longer one
ends the run with exit 4 and one line; a rerun afterwards ends exact, nothing stored twice.

The lock's margin is the shorter of its lease (60 s, Prefect's minimum) and the holder's beat
(a waiter takes the lock of a holder silent for ``HOLDER_DEAD_AFTER_S``), less one beat: 25 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import yaml

from collector import defaults
from collector.config import load_source
from collector.demo.site import FaultSite
from collector.run.stop import EXIT_LOST_FOOTING
from tests.helpers import duplicate_keys, sink_lines, write_source
from tests.redis_proxy import CutRelay

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
ITEMS = 30
MARGIN_S = defaults.HOLDER_DEAD_AFTER_S - defaults.HEARTBEAT_S  # < LOCK_LEASE_S - HEARTBEAT_S


def _source(folder: Path, site: FaultSite, name: str) -> Path:
    """A source whose run lasts ~45 s: 30 items, one at a time, 1.5 s each."""
    urls = [site.url(f"/items/{i}.json?delay=1.5") for i in range(ITEMS)]
    return write_source(
        folder,
        name=name,
        seeds={"urls": urls},
        limits={"concurrency": 1, "per_domain_concurrency": 1},
        ttl={"http_timeout_s": 5, "request_deadline_s": 5, "batch_timeout_s": 30},
    )


def _start(path: Path, api_url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*COLLECTOR, "run", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _lease_taken(path: Path, run: subprocess.Popen[str]) -> str:
    """Wait until the run holds its source lock (its beat is on record); its lease's id."""
    from flows._locks import read_beat

    source = load_source(path)

    async def poll() -> str:
        deadline = time.monotonic() + 240  # a fresh Python importing Prefect, on a loaded box
        while time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()[1][-3000:]
            _, beat = await read_beat(source)
            if beat is not None and beat.lease_id:
                return beat.lease_id
            await asyncio.sleep(0.2)
        raise AssertionError("the run never took its source lock")

    return asyncio.run(poll())


def _ended(run: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = run.communicate(timeout=600)
    return run.returncode, out, err


def _said(err: str) -> str:
    """The run's one line about its lost footing."""
    lines = [line for line in err.splitlines() if line.startswith("collector: stopped: lost")]
    assert len(lines) == 1, err[-4000:]
    return lines[0]


def _rerun_is_exact(path: Path, api_url: str, folder: Path) -> dict[str, object]:
    """The rerun of the same source (name and seeds: the same plan), its pages fetched six at a
    time: what is left of 30 slow pages, one at a time, was up to 45 s of waiting."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["limits"] = {"concurrency": 6, "per_domain_concurrency": 6}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    code, out, err = _ended(_start(path, api_url))
    assert code == 0, err[-4000:]
    summary: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    assert summary["balanced"], summary
    rows = sink_lines(folder / "out")
    assert len({row["id"] for row in rows}) == ITEMS and duplicate_keys(rows) == []
    return summary


def test_a_run_whose_lock_is_taken_back_exits_4_says_so_and_a_rerun_is_exact(
    tmp_path: Path, prefect_api: str
) -> None:
    """A waiter that judged the run dead released its lease: at its next renewal (every 15 s)
    the run finds it gone, stops claiming, settles or gives back what it held, exits 4 with one
    line naming the lock and why, and publishes the ledger of what it settled; the rerun stores
    the rest, nothing twice."""
    from prefect.client.orchestration import get_client

    async def release(lease_id: str) -> None:
        async with get_client() as client:
            await client.release_concurrency_slots_with_lease(UUID(lease_id))

    async def published() -> dict[str, object]:
        """The ledger the run published before it ended (the Prefect UI's summary table)."""
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        key = ArtifactFilterKey(any_=["collector-footing-cli-summary"])
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=key))
        assert found, "the run published no ledger"
        table = max(found, key=lambda a: a.created or 0).data
        return {row["count"]: row["value"] for row in json.loads(str(table))}

    with FaultSite() as site:
        path = _source(tmp_path, site, "footing-cli")
        run = _start(path, prefect_api)
        asyncio.run(release(_lease_taken(path, run)))
        code, out, err = _ended(run)
        said = _said(err)
        print(said)
        print(f"stdout: {out.strip()[-1000:]!r}")
        assert code == EXIT_LOST_FOOTING, err[-4000:]
        assert "its source lock 'source:footing-cli': the server no longer has its lease" in said
        assert "(410 Gone: " in said and "mozilla" not in said and "http" not in said, said
        assert "Traceback" not in err, err[-4000:]
        stored = len(sink_lines(tmp_path / "out"))
        assert stored < ITEMS, "the run went on to the end after it lost its lock"
        # its account on stdout, as after any ending: what it stored, what it gave back
        printed = json.loads(out.strip().splitlines()[-1])
        assert printed["ending"] == "lost" and printed["balanced"] is True, printed
        assert printed["stored"] == stored and printed["queued"] == ITEMS - stored, printed
        ledger = asyncio.run(published())
        print(f"published: {ledger}")
        assert str(ledger["ended"]).startswith("lost (its source lock 'source:footing-cli'")
        assert ledger["balanced"] is True and ledger["stored"] == stored
        assert ledger["queued"] == ITEMS - stored  # given back: nothing left leased
        summary = _rerun_is_exact(path, prefect_api, tmp_path)
    print(f"first run stored {stored}; the rerun: {summary}")


def test_the_prefect_api_away_shorter_than_the_margin_is_ridden_out(
    tmp_path: Path, prefect_api: str
) -> None:
    """The API is unreachable from a little after the lock is taken to past its first renewal
    (15 s in), for less than the margin: the renewal and the beats are retried, the run goes on
    and ends Completed and exact."""
    port = int(prefect_api.split(":")[-1].split("/")[0])
    with FaultSite() as site, CutRelay(port) as relay:
        path = _source(tmp_path, site, "footing-api-short")
        run = _start(path, relay.url())
        _lease_taken(path, run)
        time.sleep(6)
        relay.down()
        time.sleep(MARGIN_S / 2)  # 12.5 s: the renewal at 15 s falls inside
        relay.up()
        code, out, err = _ended(run)
        assert relay.refused > 0  # the run did try the API while it was away
        assert code == 0, err[-4000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["balanced"] and summary["stored"] == ITEMS, summary
        missed = [line for line in err.splitlines() if "prefect.flows._locks" in line]
        print(f"refused {relay.refused}; the lock's calls that met the outage: {missed}")
        assert missed, err[-4000:]  # the lock's beats (and its renewal) were retried, not lost
    rows = sink_lines(tmp_path / "out")
    assert len({row["id"] for row in rows}) == ITEMS and duplicate_keys(rows) == []


def test_the_prefect_api_away_past_the_margin_exits_4_and_a_rerun_is_exact(
    tmp_path: Path, prefect_api: str
) -> None:
    """The API stays away past the margin: the run may no longer count on its lock (a waiter may
    take it), so it stops, exits 4 and says which lock and why; the rerun ends exact."""
    port = int(prefect_api.split(":")[-1].split("/")[0])
    with FaultSite() as site, CutRelay(port) as relay:
        path = _source(tmp_path, site, "footing-api-long")
        run = _start(path, relay.url())
        _lease_taken(path, run)
        time.sleep(3)
        relay.down()
        time.sleep(MARGIN_S + 10)
        relay.up()
        code, _, err = _ended(run)
        said = _said(err)
        print(said)
        assert code == EXIT_LOST_FOOTING, err[-4000:]
        assert "its source lock 'source:footing-api-long'" in said
        summary = _rerun_is_exact(path, prefect_api, tmp_path)
    print(f"the rerun: {summary}")
