"""Conditional refetches (collector.fetch.conditional): validators sent as kept, 304 handled,
against a real nginx (its own ETag / Last-Modified) and a local site whose pages change; then
whole runs, where a 304 makes a page fresh again with nothing parsed or written and is counted
as ``not_modified`` in a ledger that balances."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.config import load_source
from collector.fetch import conditional
from collector.fetch.conditional import Validators
from collector.fetch.engine import FetchEngine, FetchResult
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from collector.run.collection import Collection
from collector.run.summary import RunSummary
from tests.change_site import ChangeSite
from tests.helpers import drain_in_process, sink_lines, write_source
from tests.static_nginx import StaticNginx

# --- the headers, plainly ---------------------------------------------------------------------
_tags = st.one_of(
    st.none(),
    st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters='"'))
    .map(lambda t: f'"{t}"')
    .flatmap(lambda t: st.sampled_from([t, "W/" + t])),
)
_dates = st.one_of(st.none(), st.sampled_from(["Tue, 01 Dec 2026 10:00:00 GMT", "garbage"]))


@given(etag=_tags, modified=_dates)
def test_the_headers_carry_the_kept_validators_as_given(
    etag: str | None, modified: str | None
) -> None:
    item = ClaimedItem("http://h/p", 0, None, 0.0, etag, modified)
    headers = conditional.request_headers(item)
    expected = {}
    if etag is not None:
        expected["If-None-Match"] = etag  # weak tags too: If-None-Match compares weakly
    if modified is not None:
        expected["If-Modified-Since"] = modified  # the server's own text, not re-formatted
    assert headers == (expected or None)


def test_a_304_keeps_what_it_sends_and_else_what_the_item_had() -> None:
    item = ClaimedItem("http://h/p", 0, None, 0.0, '"a"', "Mon, 30 Nov 2026 00:00:00 GMT")
    assert conditional.after_not_modified(item, Validators()) == (item.etag, item.last_modified)
    assert conditional.after_not_modified(item, Validators('"b"', None)) == (
        '"b"',
        item.last_modified,
    )
    assert conditional.validators_of({"etag": " ", "last-modified": ""}) == Validators()


# --- the engine against real servers -----------------------------------------------------------
def _engine(**options: Any) -> FetchEngine:
    settings: dict[str, Any] = {
        "retry": RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=2),
        "host_policy": HostPolicy(allow_private_networks=True),
        "http_timeout_s": 2.0,
        "request_deadline_s": 3.0,
        "concurrency": 4,
        "per_domain_concurrency": 4,
    }
    return FetchEngine(**{**settings, **options})


async def _fetch(items: list[ClaimedItem], **options: Any) -> list[FetchResult]:
    async with _engine(**options) as engine:
        return await engine.fetch_batch(items, budget=RetryBudget(ratio=1.0, min_retries=10))


def _again(result: FetchResult) -> ClaimedItem:
    """The item as its next claim returns it: with the validators its fetch left."""
    return ClaimedItem(result.url, 0, None, 0.0, result.etag, result.last_modified)


@pytest.fixture(scope="module")
def nginx() -> Iterator[StaticNginx]:
    with StaticNginx() as site:
        yield site


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_nginx_answers_304_to_its_own_validators(nginx: StaticNginx, transport: str) -> None:
    name = f"items/{transport}.json"
    nginx.write(name, b'{"id": 1, "v": 1}', mtime=1_780_000_000)
    (first,) = await _fetch([ClaimedItem(nginx.url(name), 0, None, 0.0)], transport=transport)
    assert first.status == "ok" and first.body == b'{"id": 1, "v": 1}'
    assert first.etag is not None and first.etag.startswith('"')  # nginx: "<mtime>-<size>"
    assert first.last_modified == "Thu, 28 May 2026 20:26:40 GMT"

    (second,) = await _fetch([_again(first)], transport=transport)
    assert (second.status, second.http_status, second.body) == ("not_modified", 304, b"")
    assert (second.etag, second.last_modified) == (first.etag, first.last_modified)

    # only the ETag, then only the date: nginx honours each alone
    etag_only = ClaimedItem(first.url, 0, None, 0.0, first.etag, None)
    date_only = ClaimedItem(first.url, 0, None, 0.0, None, first.last_modified)
    assert [r.status for r in await _fetch([etag_only, date_only], transport=transport)] == [
        "not_modified",
        "not_modified",
    ]

    nginx.write(name, b'{"id": 1, "v": 22}', mtime=1_780_000_100)  # changed: new size and time
    (third,) = await _fetch([_again(second)], transport=transport)
    assert (third.status, third.body) == ("ok", b'{"id": 1, "v": 22}')
    assert third.etag != first.etag and third.last_modified != first.last_modified


async def test_a_plain_request_without_validators_sends_no_conditions(nginx: StaticNginx) -> None:
    nginx.write("items/plain.json", b'{"id": 2}')
    (first,) = await _fetch([ClaimedItem(nginx.url("items/plain.json"), 0, None, 0.0)])
    (again,) = await _fetch([ClaimedItem(first.url, 0, None, 0.0)])  # none kept: plain
    assert again.status == "ok" and again.body == b'{"id": 2}'
    async with _engine(conditional=False) as engine:  # politeness.conditional: false
        (off,) = await engine.fetch_batch(
            [_again(first)], budget=RetryBudget(ratio=1.0, min_retries=10)
        )
    assert off.status == "ok" and off.body == b'{"id": 2}'


async def test_each_validator_behaviour_of_a_changing_site() -> None:
    with ChangeSite() as site:
        modes = ("strong", "weak", "date", "ignore", "none")
        for mode in modes:
            site.set(mode, json.dumps({"id": mode, "v": 1}).encode(), mode)
        urls = [site.url(m) for m in modes]
        first = await _fetch([ClaimedItem(u, 0, None, 0.0) for u in urls])
        assert [r.status for r in first] == ["ok"] * 5
        assert first[1].etag is not None and first[1].etag.startswith('W/"')
        assert first[2].etag is None and first[2].last_modified is not None
        assert (first[4].etag, first[4].last_modified) == (None, None)

        second = await _fetch([_again(r) for r in first])
        statuses = dict(zip(modes, (r.status for r in second), strict=True))
        assert statuses == {
            "strong": "not_modified",
            "weak": "not_modified",  # the weak tag went back as given, and matched
            "date": "not_modified",
            "ignore": "ok",  # 200 again: handled as any 200
            "none": "ok",
        }
        sent = {name: (tag, since) for name, tag, since, _ in site.log[5:]}
        assert sent["weak"] == (first[1].etag, first[1].last_modified)
        assert sent["none"] == (None, None)
        assert second[3].body == first[3].body

        for mode in modes:
            site.set(mode, json.dumps({"id": mode, "v": 2}).encode())
        third = await _fetch([_again(r) for r in second])
        assert [r.status for r in third] == ["ok"] * 5  # every changed page is fetched whole
        assert all(b'"v": 2' in r.body for r in third)


async def test_a_304_nobody_asked_for_stays_an_error() -> None:
    with ChangeSite() as site:
        site.set("l", b'{"id": 1}', "lie")
        (plain,) = await _fetch([ClaimedItem(site.url("l"), 0, None, 0.0)])
        assert plain.status == "ok"  # no If-None-Match sent: the liar has nothing to lie to
        (lied,) = await _fetch([_again(plain)])
        assert lied.status == "not_modified"  # indistinguishable from the truth (docs)


# --- whole runs ----------------------------------------------------------------------------------
HOUR = 3_600.0


async def _run(path: Path, *, run_id: str, clock: Callable[[], float]) -> tuple[RunSummary, int]:
    with Collection(load_source(path), run_id=run_id, clock=clock) as run:
        run.plan()
        await drain_in_process(run, batch_size=7)
        run.finish()
        return run.summary(), run.pages_ok


def _runs(path: Path) -> Callable[[str, float], tuple[RunSummary, int]]:
    def at(run_id: str, offset_s: float) -> tuple[RunSummary, int]:
        return asyncio.run(_run(path, run_id=run_id, clock=lambda: time.time() + offset_s))

    return at


def test_runs_refetch_conditionally_and_count_not_modified(tmp_path: Path) -> None:
    with ChangeSite() as site:
        names = [f"p{i}" for i in range(20)]
        for i, name in enumerate(names):
            # real mess: a steady share of pages without validators or that ignore them
            mode = "none" if i % 10 == 3 else "ignore" if i % 10 == 7 else "strong"
            site.set(name, json.dumps({"id": i, "v": 0}).encode(), mode)
        path = write_source(
            tmp_path,
            name="conditional",
            seeds={"urls": [site.url(n) for n in names]},
            ttl={"default_fresh_s": HOUR},
        )
        run = _runs(path)
        first, parsed = run("r1", 0)
        assert (first.stored, first.not_modified, first.records_written) == (20, 0, 20)
        assert first.balanced and parsed == 20
        sink = tmp_path / "out"
        before = {f: f.read_bytes() for f in sink.glob("*.jsonl")}

        fresh, _ = run("r2", 10)  # still fresh: nothing fetched at all
        assert (fresh.discovered, fresh.requests) == (0, 0)  # an unchanged plan: none due

        second, parsed = run("r3", 2 * HOUR)  # stale: refetched with the validators
        assert second.balanced, second.problems
        assert (second.not_modified, second.stored) == (16, 4)  # 2 plain, 2 ignoring: 200
        assert parsed == 4  # the 304s were neither parsed nor validated ...
        assert (second.records_written, second.records_unchanged) == (0, 4)
        assert {f: f.read_bytes() for f in sink.glob("*.jsonl")} == before  # ... nor written
        asked = [(tag, since) for name, tag, since, _ in site.log[-20:]]
        assert sum(1 for tag, _ in asked if tag) == 18  # every page that had a tag sent it

        for i in (0, 1, 3):  # two pages with validators change, and one without
            site.set(names[i], json.dumps({"id": i, "v": 1}).encode())
        third, parsed = run("r4", 4 * HOUR)
        assert third.balanced, third.problems
        assert (third.not_modified, third.stored, third.records_written) == (14, 6, 3)
        rows = {row["id"]: row for row in sink_lines(sink)}
        assert all(rows[i]["v"] == 1 for i in (0, 1, 3))
        assert third.discovered == third.stored + third.not_modified


def test_compensated_pages_are_fetched_whole_again(tmp_path: Path) -> None:
    """make_stale (compensate, audit) forgets the validators: the records it removed are
    fetched and written again, not answered 304 and lost."""
    from collector.backends import open_frontier

    with ChangeSite() as site:
        for i in range(5):
            site.set(f"c{i}", json.dumps({"id": i}).encode())
        urls = [site.url(f"c{i}") for i in range(5)]
        path = write_source(
            tmp_path, name="comp", seeds={"urls": urls}, ttl={"default_fresh_s": HOUR}
        )
        run = _runs(path)
        assert run("r1", 0)[0].stored == 5
        with open_frontier(load_source(path)) as frontier:
            assert frontier.make_stale("comp", urls[:2]) == 2
        second, _ = run("r2", 2 * HOUR)
        assert (second.stored, second.not_modified) == (2, 3)
        assert second.balanced, second.problems


def test_a_redis_frontier_keeps_the_validators_between_runs(tmp_path: Path, redis_url: str) -> None:
    with ChangeSite() as site:
        for i in range(6):
            site.set(f"r{i}", json.dumps({"id": i}).encode(), "weak" if i % 2 else "date")
        path = write_source(
            tmp_path,
            name="conditional-redis",
            seeds={"urls": [site.url(f"r{i}") for i in range(6)]},
            ttl={"default_fresh_s": HOUR},
            frontier={"type": "redis", "url": redis_url},
        )
        run = _runs(path)
        assert run("r1", 0)[0].stored == 6
        second, parsed = run("r2", 2 * HOUR)
        assert (second.not_modified, second.stored, parsed) == (6, 0, 0)
        assert second.balanced, second.problems
