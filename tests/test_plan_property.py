"""Plans over seed lists that change between runs, as a Hypothesis property.

Each example is a sequence of runs of one source (real SQLite frontier, real JSONL sink and
dead-letter store, the real ``Collection`` steps; only the HTTP fetch is replaced by results
built here, which the brief allows for a property over the plan). Between runs the seed list
changes at random (or not), ``seeds.on_removed`` is drawn, the clock moves so freshness runs
out, and each run drains only part of its queue. After every run:

- the run's ledger balances (``Ledger.close`` checks it both ways against the frontier);
- no URL the run was not meant to fetch is claimed: with ``retire`` nothing outside the current
  list, and never one while it is fresh;
- every URL ever listed is in the frontier exactly once (counts add up), and each stored record
  is in the sink once.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.config import load_source
from collector.fetch.engine import FetchResult
from collector.run.collection import Collection
from tests.helpers import duplicate_keys, sink_lines, write_source

POOL = 24
FRESH_S = 100.0


def _url(n: int) -> str:
    return f"https://items.example.test/items/{n}.json"


# One run: (seed list, seeds.on_removed, most items drained, clock step, keep the previous list).
Run = tuple[frozenset[int], str, int, float, bool]
FileRun = tuple[tuple[int, ...], str, int, float, bool]  # the list: a seed file's lines


def _runs(lists: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """1 to 5 runs, each (a seed list drawn from ``lists``, on_removed, items drained at most,
    clock step, keep the previous list)."""
    return st.lists(
        st.tuples(
            lists,
            st.sampled_from(["retire", "collect"]),
            st.integers(0, 30),  # how many items the run drains at most
            st.sampled_from([0.0, 10.0, 150.0]),  # clock step before the run
            st.booleans(),  # keep the previous list unchanged (an incremental plan)
        ),
        min_size=1,
        max_size=5,
    )


runs = _runs(st.frozensets(st.integers(0, POOL - 1), min_size=1, max_size=POOL))


# the same, with the list a template over a range: a range-only change is a difference plan
_window = st.integers(0, POOL - 1).flatmap(
    lambda a: st.integers(a + 1, POOL).map(lambda b: frozenset(range(a, b)))
)
ranged_runs = _runs(_window)


async def _drain(run: Collection, limit: int) -> list[str]:
    claimed: list[str] = []
    while len(claimed) < limit:
        lease = await run.claim(min(7, limit - len(claimed)))
        if not lease.items:
            break
        now = run.clock()
        results = []
        for item in lease.items:
            n = int(item.url.rsplit("/", 1)[1].split(".")[0])
            body = f'{{"id": {n}}}'.encode()
            results.append(FetchResult(item.url, "ok", 1, now, item.url, 200, body))
        await run.settle(lease, results)
        claimed += [i.url for i in lease.items]
    return claimed


# Found by CI: a list kept while on_removed goes collect -> retire must sweep the item the
# collect plan carried over (the policy is part of the seed mark, so the plan is a full one).
_POLICY_SWITCH = [
    (frozenset({0, 1}), "retire", 0, 0.0, False),
    (frozenset({0}), "collect", 0, 0.0, False),
    (frozenset({0}), "retire", 2, 0.0, False),
]

_EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_EXAMPLES
@given(runs)
@example(_POLICY_SWITCH)
def test_every_run_balances_whatever_the_seed_list_does(plan: list[Run]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_play(Path(folder), plan, {}))


@_EXAMPLES
@given(runs)
@example(plan=_POLICY_SWITCH)
def test_every_run_balances_on_a_redis_frontier(redis_url: str, plan: list[Run]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        # a source name of its own per example: the Redis database is shared by the examples
        section = {"frontier": {"type": "redis", "url": redis_url}, "name": Path(folder).name}
        asyncio.run(_play(Path(folder), plan, section))


# the same, with the list a seed file: lines in any order, repeated, moved, spaced, commented;
# an edit with the same on_removed is a difference plan (collector.run.seedlist)
file_runs = _runs(st.lists(st.integers(0, POOL - 1), min_size=1, max_size=2 * POOL).map(tuple))


@_EXAMPLES
@given(file_runs)
def test_every_run_balances_when_a_seed_file_is_edited(plan: list[FileRun]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_play(Path(folder), plan, {}, twin=Path(folder) / "twin"))


@_EXAMPLES
@given(file_runs)
def test_every_run_balances_when_a_seed_file_is_edited_on_redis(
    redis_url: str, plan: list[FileRun]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        section = {"frontier": {"type": "redis", "url": redis_url}, "name": Path(folder).name}
        asyncio.run(_play(Path(folder), plan, section, twin=Path(folder) / "twin"))


@_EXAMPLES
@given(ranged_runs)
def test_every_run_balances_when_a_template_range_moves(plan: list[Run]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_play(Path(folder), plan, {}, template=True))


@_EXAMPLES
@given(ranged_runs)
def test_every_run_balances_when_a_template_range_moves_on_redis(
    redis_url: str, plan: list[Run]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        section = {"frontier": {"type": "redis", "url": redis_url}, "name": Path(folder).name}
        asyncio.run(_play(Path(folder), plan, section, template=True))


def _seeds(
    folder: Path, listed: frozenset[int] | tuple[int, ...], template: bool
) -> dict[str, Any]:
    if template:  # listed is a window: range(min, max + 1)
        return {
            "template": _url(0).replace("/0.json", "/{i}.json"),
            "range": [min(listed), max(listed) + 1],
        }
    if isinstance(listed, frozenset):
        return {"urls": [_url(n) for n in sorted(listed)]}
    # a seed file: a comment, a blank line, some lines spaced, CRLF or LF, maybe no final break
    lines = ["# items"] + [f"  {_url(n)} " if n % 3 == 0 else _url(n) for n in listed]
    lines.insert(len(lines) // 2, "")
    newline = "\r\n" if len(listed) % 4 == 1 else "\n"
    text = newline.join(lines) + ("" if len(listed) % 2 else newline)
    (folder / "seeds.txt").write_bytes(text.encode())
    return {"file": "seeds.txt"}


async def _play(
    folder: Path,
    plan: list[Run] | list[FileRun],
    backend: dict[str, Any],
    *,
    template: bool = False,
    twin: Path | None = None,
) -> None:
    """Play the runs; with ``twin``, each run also in a twin source planned in full (never
    from a kept copy of the list), whose frontier must end up the same after every step."""
    clock = [1_700_000_000.0]
    listed: frozenset[int] | tuple[int, ...] = frozenset()
    ever: set[str] = set()
    fresh_until: dict[str, float] = {}
    before: tuple[object, str] | None = None  # the last plan's list and policy
    for number, (seeds, on_removed, limit, step, same) in enumerate(plan):
        if not same or not listed:
            listed = seeds  # type: ignore[assignment]  # a frozenset or a tuple: both Run kinds
        kind = "full"
        if before == (listed, on_removed):
            kind = "incremental"
        elif before is not None and before[1] == on_removed:
            kind = "difference"  # only the range or the listed seeds changed
        before = (listed, on_removed)
        clock[0] += step
        seeds_section = {**_seeds(folder, listed, template), "on_removed": on_removed}
        path = write_source(
            folder,
            seeds=seeds_section,
            ttl={"default_fresh_s": FRESH_S, "queue_ttl_s": 10_000},
            state_dir="state",
            **backend,
        )
        source = load_source(path)
        with Collection(source, run_id=f"run-{number}", clock=lambda: clock[0]) as run:
            ledger = run.plan()
            assert ledger.plan == kind, (number, ledger.plan, kind)
            planned = run.frontier.counts(source.name)
            claimed = await _drain(run, limit)
            ledger = run.finish()
            assert ledger.balanced, (number, ledger.problems)
            counts = run.frontier.counts(source.name)
        if twin is not None:  # the same run planned in full must leave the same frontier
            twin.mkdir(exist_ok=True)
            if not template:
                _seeds(twin, listed, template)
            twin_backend = {**backend, "name": f"{backend['name']}-twin"} if backend else {}
            twin_source = load_source(
                write_source(
                    twin,
                    seeds=seeds_section,
                    ttl={"default_fresh_s": FRESH_S, "queue_ttl_s": 10_000},
                    state_dir="state",
                    **twin_backend,
                )
            )
            shutil.rmtree(twin / "state" / "seedlists", ignore_errors=True)
            with Collection(twin_source, run_id=f"run-{number}", clock=lambda: clock[0]) as full:
                assert full.plan().plan in ("full", "incremental")
                assert full.frontier.counts(twin_source.name) == planned, number
                assert sorted(await _drain(full, limit)) == sorted(claimed), number
                full.finish()
                assert full.frontier.counts(twin_source.name) == counts, number
        now = clock[0]
        names = {_url(n) for n in listed}
        ever |= names
        for url in claimed:
            # retired items are never fetched: a run of that policy fetches its list only
            assert on_removed == "collect" or url in names, url
            assert fresh_until.get(url, 0.0) <= now, f"{url} fetched while fresh"
            fresh_until[url] = now + FRESH_S
        assert len(claimed) == len(set(claimed))
        assert counts.total == len(ever)
        rows = sink_lines(folder / "out")
        assert duplicate_keys(rows) == []
        assert {int(r["id"]) for r in rows} == {
            int(u.rsplit("/", 1)[1].split(".")[0]) for u in fresh_until
        }
