"""Within a source, items of priority (weight) >= 8 are claimed ahead of every other due item
planned with them, on both real frontiers; and where that stops by design: an item that has
waited long enough outranks a newer one of any weight (aging: nothing starves)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from collector.config import Source, load_source
from collector.frontier.base import Frontier, Offer
from collector.run.collection import Collection

WEIGHTS = (9, 5, 8, 2, 7, 10, 5, 3, 8, 6, 1, 4)  # a mixed catalogue; 8, 9, 10 are "critical"


def _source(tmp_path: Path, frontier: dict[str, str] | None) -> Source:
    urls = [f"http://127.0.0.1:9/w{WEIGHTS[i % len(WEIGHTS)]}/item/{i}" for i in range(240)]
    document = {
        "name": "prio",
        "seeds": {"urls": urls},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,  # an IP literal: judged without a DNS lookup
        "priority": {
            "weight": 5,
            "rules": [{"pattern": f"/w{w}/", "weight": w} for w in sorted(set(WEIGHTS))],
        },
        **({"frontier": frontier} if frontier else {}),
    }
    path = tmp_path / "prio.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return load_source(path)


@pytest.fixture(params=["sqlite", "redis"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield _source(tmp_path, {"type": "redis", "url": url})
    else:
        yield _source(tmp_path, None)


def _weight(url: str) -> int:
    return int(url.split("/w")[1].split("/")[0])


def test_priority_8_and_above_are_claimed_before_every_other_due_item(source: Source) -> None:
    claimed: list[str] = []

    async def claim_all(run: Collection) -> None:
        while lease := (await run.claim(7)).items:
            claimed.extend(item.url for item in lease)

    with Collection(source, run_id="prio-run") as run:
        run.plan()
        asyncio.run(claim_all(run))
    assert len(claimed) == 240
    weights = [_weight(url) for url in claimed]
    high = [w >= 8 for w in weights]
    first_low = high.index(False)
    assert all(high[:first_low]) and not any(high[first_low:]), weights
    assert weights == sorted(weights, reverse=True)  # and by weight among the rest too


def test_an_item_that_waited_long_enough_outranks_a_newer_critical_one(source: Source) -> None:
    """The limit of the rule, by design: aging lifts what waits (1 point a minute by default),
    so a weight-5 item queued 5 minutes before a weight-9 one is claimed first."""
    frontier: Frontier
    with Collection(source, run_id="prio-aging") as run:
        frontier = run.frontier
        priority = source.priority

        def offer(url: str, now: float) -> None:
            frontier.offer(
                source.name, [Offer(url, 3600.0)], now=now, queue_ttl_s=86400,
                rank_for=lambda u, age, fresh: priority.rank_for(
                    u, enqueued_at=now, age_s=age, fresh_s=fresh
                ),
                run_id="prio-aging",
            )  # fmt: skip

        start = 1_000_000.0
        offer("https://shop.example/w5/old", start)
        offer("https://shop.example/w9/new-soon", start + 60)  # 1 minute later: 9 > 5 + 1
        offer("https://shop.example/w9/new-late", start + 300)  # 5 minutes later: 9 < 5 + 5
        order = [
            item.url
            for item in itertools.chain.from_iterable(
                frontier.claim(source.name, 1, now=start + 301, lease_s=60).items for _ in range(3)
            )
        ]
    assert order == [
        "https://shop.example/w9/new-soon",
        "https://shop.example/w5/old",
        "https://shop.example/w9/new-late",
    ]
