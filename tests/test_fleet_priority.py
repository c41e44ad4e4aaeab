"""Within a source, items of priority (weight) >= 8 go to the head of the queue, on both real
frontiers: planned together they are claimed first, and one offered behind thousands of older
items is claimed next. Where aging may overtake one, by design (collector.policy.priority): an
older critical item, and an item of weight < 8 that has waited longer than the critical head
start (an hour) plus its weight gap's worth of aging; a property test holds the frontier's
order to a plain model of that rule."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import Source, load_source
from collector.frontier.base import Frontier, Offer
from collector.policy.priority import (
    CRITICAL_HEAD_START_S,
    CRITICAL_WEIGHT,
    PriorityRule,
    PrioritySettings,
)
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


START = 1_000_000.0  # the frontier's clock in these tests (UNIX seconds)


def _offer(frontier: Frontier, source: Source, urls: list[str], now: float) -> None:
    """Queue ``urls`` as offered at ``now`` (never fetched), ranked as the planner ranks them."""
    priority = source.priority
    frontier.offer(
        source.name, [Offer(url, 3600.0) for url in urls], now=now, queue_ttl_s=86400 * 7,
        rank_for=lambda u, age, fresh: priority.rank_for(
            u, enqueued_at=now, age_s=age, fresh_s=fresh
        ),
        run_id="prio-head",
    )  # fmt: skip


def _claim_order(frontier: Frontier, source: Source, n: int, now: float) -> list[str]:
    return [
        item.url
        for item in itertools.chain.from_iterable(
            frontier.claim(source.name, 1, now=now, lease_s=60).items for _ in range(n)
        )
    ]


@pytest.mark.parametrize("weight", [8, 9, 10])
def test_a_critical_item_offered_behind_thousands_of_older_ones_is_claimed_next(
    source: Source, weight: int
) -> None:
    """3,000 items of every weight below 8, queued over the 55 minutes before, then one of
    weight >= 8: it is the next claimed, and the backlog follows in its own order."""
    now = START + 55 * 60
    with Collection(source, run_id="prio-head") as run:
        frontier = run.frontier
        for minute in range(55):  # 55 offers of 55 items a minute apart: 3,025 older items
            urls = [f"https://shop.example/w{1 + n % 7}/old/{minute}/{n}" for n in range(55)]
            _offer(frontier, source, urls, START + minute * 60)
        _offer(frontier, source, [f"https://shop.example/w{weight}/new"], now)
        order = _claim_order(frontier, source, 3, now + 1)
    assert order[0] == f"https://shop.example/w{weight}/new", order
    assert all(_weight(url) < CRITICAL_WEIGHT for url in order[1:])


def test_where_aging_overtakes_a_new_critical_item(source: Source) -> None:
    """By design (1 point a minute, the head start an hour): an older critical item (weight 8
    queued 3 minutes before a weight 10 one), and a weight-5 item that waited longer than the
    head start and the weight gap (70 minutes); not one that waited 63 minutes."""
    with Collection(source, run_id="prio-aging") as run:
        frontier = run.frontier
        now = START + 3 * 3600
        _offer(frontier, source, ["https://shop.example/w5/70-minutes"], now - 70 * 60)
        _offer(frontier, source, ["https://shop.example/w5/63-minutes"], now - 63 * 60)
        _offer(frontier, source, ["https://shop.example/w8/3-minutes"], now - 3 * 60)
        _offer(frontier, source, ["https://shop.example/w9/new"], now)
        _offer(frontier, source, ["https://shop.example/w10/new"], now)
        order = _claim_order(frontier, source, 5, now)
    assert order == [
        "https://shop.example/w5/70-minutes",  # 5 + 70 > 10 + 60: waited past the head start
        "https://shop.example/w8/3-minutes",  # 8 + 3 + 60 > 10 + 60: aging among critical ones
        "https://shop.example/w10/new",
        "https://shop.example/w9/new",
        "https://shop.example/w5/63-minutes",  # 5 + 63 < 9 + 60: still behind the new ones
    ]


# --- the rule against a plain model ------------------------------------------------------------
def _model_points(
    items: list[tuple[int, float]], now: float, aging_per_minute: float
) -> list[float]:
    """The rule written plainly, item by item at claim time ``now``: points = weight + a minute
    of waiting per ``aging_per_minute``, an hour of waiting more for weight >= 8; the most
    points are claimed first. Items are (weight, enqueued_at), never fetched, no retries."""
    return [
        weight + aging_per_minute * (now - enqueued_at + (3600.0 if weight >= 8 else 0.0)) / 60.0
        for weight, enqueued_at in items
    ]


ITEMS = st.lists(
    st.tuples(st.integers(min_value=1, max_value=10), st.integers(min_value=0, max_value=7200)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(items=ITEMS, aging=st.sampled_from([0.1, 1.0, 6.0]), now_after=st.integers(0, 600))
def test_rank_order_is_the_plain_model_and_critical_items_lead(
    items: list[tuple[int, int]], aging: float, now_after: int
) -> None:
    """Ranks sorted as a frontier sorts them are in the model's order (up to equal points); and
    whenever every item of weight < 8 waited less than the head start, every critical item is
    claimed before all of them."""
    priority = PrioritySettings(
        weight=5, aging_per_minute=aging,
        rules=tuple(PriorityRule(pattern=f"/w{w}/", weight=w) for w in range(1, 11)),
    )  # fmt: skip
    queued = [(weight, START + offset) for weight, offset in items]
    now = START + 7200 + now_after
    ranks = [
        priority.rank_for(f"https://x/w{w}/{i}", enqueued_at=t, age_s=None, fresh_s=60)
        for i, (w, t) in enumerate(queued)
    ]
    by_rank = sorted(range(len(queued)), key=lambda i: (-ranks[i], i))
    points = _model_points([(w, float(t)) for w, t in queued], now, aging)
    for first, then in itertools.pairwise(by_rank):  # the model never puts `then` first
        assert points[first] >= points[then] - 1e-6, (queued[first], queued[then])
    if all(now - t < CRITICAL_HEAD_START_S for w, t in queued if w < CRITICAL_WEIGHT):
        critical = [w >= CRITICAL_WEIGHT for w in (queued[i][0] for i in by_rank)]
        assert critical == sorted(critical, reverse=True)
