"""`collector run` against a real site with a little noise: the adaptive defaults keep pace.

The issue-25 mix, at a steady share whatever the rate: 4 % of the pages answer 503 once, 2 %
answer 429 with ``Retry-After: 1`` once, 10 % are 404 and 2 % malformed. Timed side by side in
one test, both through the real CLI in a subprocess: ``limits: {adaptive: false}`` and the
defaults. The adaptive run must store the same and take at most 2.5x the fixed run's time
(both read from the run's own summary, so Prefect's start-up is not in the ratio; the issue
measured 24 s fixed against a run stopped after 96 s with 290 of 2,640 stored). Each run has a
site of its own: the faults are once per URL and site, so a shared site would spare the second
run its noise. Measured: fixed 8.8 s, adaptive 9.7 s (x1.10); main's gate did not end within
3x the fixed run's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from collector.demo.site import FaultSite
from tests.helpers import write_source

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
ITEMS = 1500


def _urls(site: FaultSite) -> list[str]:
    """The mix, spread evenly over the items (so it is the same share at any rate)."""
    urls = []
    for i in range(ITEMS):
        if i % 50 in (0, 1):
            urls.append(site.url(f"/items/{i}.json?status=503"))
        elif i % 50 == 2:
            urls.append(site.url(f"/items/{i}.json?status=429&retry_after=1"))
        elif i % 50 == 3:
            urls.append(site.url(f"/items/{i}.json?malformed=1"))
        elif i % 10 == 5:
            urls.append(site.url(f"/missing/{i}.json"))
        else:
            urls.append(site.url(f"/items/{i}.json"))
    return urls


def _run(folder: Path, api: str, limits: dict[str, Any], bound_s: float) -> Any:
    """One ``collector run --json`` against a site of its own (the faults are once per URL and
    site); returns its summary with ``wall_s``, the subprocess's wall time."""
    folder.mkdir()
    with FaultSite() as site:
        return _run_against(folder, site, api, limits, bound_s)


def _run_against(
    folder: Path, site: FaultSite, api: str, limits: dict[str, Any], bound_s: float
) -> Any:
    source = write_source(
        folder,
        name=f"noisy-{folder.name}",
        seeds={"urls": _urls(site)},
        limits=limits,
        retry={"base_s": 0.5, "cap_s": 30, "max_attempts": 4},
        ttl={"http_timeout_s": 5, "request_deadline_s": 10, "batch_timeout_s": 120, "lease_s": 240},
    )
    env = {**os.environ, "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*COLLECTOR, "run", str(source), "--json"],
            capture_output=True, text=True, env=env, timeout=bound_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired as stopped:
        raise AssertionError(
            f"{limits}: no end within {bound_s:.0f} s; last output: "
            f"{(stopped.stderr or b'')[-800:]!r}"
        ) from None
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: some items dead-lettered
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.monotonic() - started
    return summary


def test_a_noisy_site_is_collected_adaptive_as_fast_as_fixed(
    tmp_path: Path, prefect_api: str
) -> None:
    fixed = _run(tmp_path / "fixed", prefect_api, {"adaptive": False}, 600)
    # Bounded by the fixed run's time (x3 and 30 s more): a stall fails, not hangs.
    adaptive = _run(tmp_path / "adaptive", prefect_api, {}, 3 * fixed["wall_s"] + 30)
    expected = sum(1 for i in range(ITEMS) if i % 50 != 3 and i % 10 != 5)
    assert fixed["stored"] == expected, fixed
    assert adaptive["stored"] == expected, adaptive
    ratio = adaptive["seconds"] / fixed["seconds"]
    # 2.5, not closer to 1: the two runs go one after the other, and on a shared 2-core CI box
    # the load changes between them (a CI run saw x2.0 under load 12 where alone it is x1.1);
    # the defect this guards against is a stall (main's gate: no end within x3, then x10+).
    assert ratio <= 2.5, (
        f"adaptive took {adaptive['seconds']} s, fixed {fixed['seconds']} s (x{ratio:.2f}); "
        f"hosts {adaptive['hosts']}"
    )
