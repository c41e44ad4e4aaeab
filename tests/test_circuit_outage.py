"""A host going down mid-run and coming back, against a real local server.

With the breaker: requests sent while the host is down stay bounded (the requests in flight
when it fell, the threshold, and one round of probes per cool-down), every item is stored
after it comes back, nothing is dead-lettered, and the ledger balances with the deferrals in
``deferred_by_circuit``. Without it (the same run, ``circuit: false``), the outage turns into
one request per item per attempt and dead letters: the check can fail.

Two workers sharing a Redis frontier share the breaker: once one has opened it, the other
sends nothing during the cool-down and no more than the probes after it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget
from collector.run.collection import Collection
from tests.helpers import sink_lines, write_source
from tests.politeness_site import PolitenessSite

ITEMS = 240
OUTAGE_S = 3.0
CONCURRENCY = 8
FAILURES = 3
PROBES = 1
COOLDOWN = {"cooldown_s": 0.4, "cooldown_factor": 2, "cooldown_max_s": 1.0, "jitter": 0.1}


def _source(folder: Path, site: PolitenessSite, **limits: Any) -> Path:
    return write_source(
        folder,
        seeds={"template": site.url(0).replace("/0", "/{i}"), "range": [0, ITEMS]},
        limits={"concurrency": CONCURRENCY, "per_domain_concurrency": CONCURRENCY, **limits},
        retry={"base_s": 0.05, "cap_s": 0.2, "max_attempts": 3, "budget_min": 10_000},
    )


async def _drain(run: Collection, engine: FetchEngine, batch: int = 20) -> None:
    """claim -> fetch -> settle until nothing is left (the collect flow's loop, without Prefect)."""
    while True:
        lease = await run.claim(batch)
        if not lease.items:
            wait = await run.seconds_until_claimable()
            if wait is None:
                return
            await asyncio.sleep(min(max(wait, 0.02), 0.5))
            continue
        results = await run.fetch(engine, lease)
        await run.settle(lease, results)


class _Outage:
    """Takes the site down once it has served ``after`` items, brings it back OUTAGE_S later,
    and reads the engine's request counter at both moments."""

    def __init__(self, site: PolitenessSite, after: int) -> None:
        self.site = site
        self.after = after
        self.sent_at_down: int | None = None
        self.sent_at_up: int | None = None
        self.engine: FetchEngine | None = None

    async def run(self) -> None:
        while self.site.served() < self.after:
            await asyncio.sleep(0.005)
        assert self.engine is not None
        await asyncio.to_thread(self.site.go_down)
        self.sent_at_down = self.engine.requests_sent
        await asyncio.sleep(OUTAGE_S)
        self.sent_at_up = self.engine.requests_sent
        await asyncio.to_thread(self.site.come_back)

    @property
    def sent_while_down(self) -> int:
        assert self.sent_at_down is not None and self.sent_at_up is not None
        return self.sent_at_up - self.sent_at_down


def _collect(
    tmp_path: Path, circuit: Any
) -> tuple[Collection, dict[str, Any], _Outage, list[dict[str, Any]]]:
    with PolitenessSite() as site:
        source = load_source(_source(tmp_path, site, circuit=circuit))
        outage = _Outage(site, after=ITEMS // 3)

        async def main() -> tuple[Collection, dict[str, Any]]:
            with Collection(source, run_id=str(uuid.uuid4())) as run:
                run.plan()
                async with run.engine() as engine:
                    outage.engine = engine
                    watcher = asyncio.create_task(outage.run())
                    await _drain(run, engine)
                    if not watcher.done():  # everything dead before the host came back
                        await watcher
                    await _drain(run, engine)
                run.finish()
                return run, run.summary().as_dict()

        run, summary = asyncio.run(main())
    return run, summary, outage, sink_lines(tmp_path / "out")


def test_outage_costs_few_requests_and_no_dead_letters(tmp_path: Path) -> None:
    circuit = {"failures": FAILURES, "probes": PROBES, **COOLDOWN}
    run, summary, outage, rows = _collect(tmp_path, circuit)
    ledger = run.ledger
    assert ledger.balanced, ledger.problems
    assert ledger.stored == ITEMS and len({row["id"] for row in rows}) == ITEMS
    assert ledger.dead_lettered == 0 and ledger.queued == 0
    assert ledger.deferred_by_circuit > 0  # items went back unsent while it was down
    # In flight when it fell + the threshold + one round of probes per cool-down (>= 0.36 s).
    rounds = int(OUTAGE_S / (COOLDOWN["cooldown_s"] * 0.9)) + 1
    bound = CONCURRENCY + FAILURES + PROBES * rounds
    assert outage.sent_while_down <= bound, (outage.sent_while_down, bound)
    assert summary["deferred_by_circuit"] == ledger.deferred_by_circuit
    assert summary["hosts"]["circuit"]["opened"] >= 1
    assert summary["hosts"]["circuit"]["closed"] >= 1


def test_without_the_breaker_the_same_outage_costs_every_item(tmp_path: Path) -> None:
    """The checks above can fail: the same outage with ``circuit: false``."""
    run, _, outage, _ = _collect(tmp_path, False)
    assert run.ledger.balanced, run.ledger.problems
    assert run.ledger.deferred_by_circuit == 0
    assert run.ledger.dead_lettered > 0
    assert outage.sent_while_down > CONCURRENCY + FAILURES + 10 * PROBES


# --- two workers, one breaker --------------------------------------------------------------
def _items(site: PolitenessSite, start: int, n: int) -> list[ClaimedItem]:
    return [ClaimedItem(site.url(i), 0, None, 0.0) for i in range(start, start + n)]


def _engines(
    tmp_path: Path, site: PolitenessSite, redis_url: str | None
) -> tuple[FetchEngine, FetchEngine]:
    cooldown = {"cooldown_s": 1.0, "cooldown_factor": 2, "cooldown_max_s": 4, "jitter": 0}
    path = _source(tmp_path, site, circuit={"failures": FAILURES, "probes": 2, **cooldown})
    if redis_url is not None:
        text = path.read_text()
        path.write_text(text + f"frontier: {{type: redis, url: '{redis_url}'}}\n")
    source = load_source(path)
    engines = []
    for _ in range(2):
        with Collection(source, run_id="w") as run:
            engines.append(run.engine())
    return engines[0], engines[1]


def _budget() -> RetryBudget:
    return RetryBudget(ratio=1.0, min_retries=10_000)


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "memory"])
def test_two_workers_share_the_breaker(tmp_path: Path, redis_url: str, shared: bool) -> None:
    with PolitenessSite() as site:
        site.go_down()
        first, second = _engines(tmp_path, site, redis_url if shared else None)
        assert first.circuit is not None and first.circuit.shared is shared

        async def main() -> tuple[int, int, int]:
            async with first, second:
                await first.fetch_batch(_items(site, 0, 20), budget=_budget())
                learned = first.requests_sent
                results = await second.fetch_batch(_items(site, 20, 20), budget=_budget())
                during = second.requests_sent
                assert all(r.status in ("deferred", "failed") for r in results)
                await asyncio.sleep(1.2)  # past the cool-down: half-open
                await second.fetch_batch(_items(site, 40, 20), budget=_budget())
                return learned, during, second.requests_sent - during

        learned, during, after = asyncio.run(main())
    assert learned >= FAILURES
    if shared:
        assert during == 0  # the first worker learned, the second never tried
        assert after <= 2  # the probes
    else:
        assert during >= FAILURES  # on its own, the second worker pays the threshold too


def test_opened_and_closed_events_reach_listeners(tmp_path: Path) -> None:
    with PolitenessSite() as site:
        site.go_down()
        engine, _ = _engines(tmp_path, site, None)
        events: list[tuple[str, dict[str, Any]]] = []
        engine.circuit_listeners.append(lambda kind, data: events.append((kind, data)))

        async def main() -> list[str]:
            async with engine:
                first = await engine.fetch_batch(_items(site, 0, 10), budget=_budget())
                await asyncio.to_thread(site.come_back)
                await asyncio.sleep(1.2)
                again = [r for r in first if r.status != "ok"]
                items = [ClaimedItem(r.url, r.attempts, None, 0.0) for r in again]
                results = await engine.fetch_batch(items, budget=_budget())
                return [r.status for r in results]

        statuses = asyncio.run(main())
    assert [kind for kind, _ in events] == ["opened", "closed"]
    assert events[0][1]["host"] == "127.0.0.1"
    assert "ok" in statuses


def test_deferral_is_not_an_attempt(tmp_path: Path) -> None:
    """A deferred item keeps its attempt count: waiting out an outage never dead-letters."""
    with PolitenessSite() as site:
        site.go_down()
        engine, _ = _engines(tmp_path, site, None)

        async def main() -> tuple[list[Any], int]:
            async with engine:
                await engine.fetch_batch(_items(site, 0, 5), budget=_budget())
                sent = engine.requests_sent
                results = await engine.fetch_batch(_items(site, 100, 5), budget=_budget())
                return results, engine.requests_sent - sent

        results, sent = asyncio.run(main())
    assert sent == 0, f"{sent} requests sent to a host whose circuit is open"  # deferred at once
    assert [r.status for r in results] == ["deferred"] * 5
    assert all(r.attempts == 0 and r.not_before > time.time() for r in results)


_ = threading  # the site runs in its own thread (tests.politeness_site)
