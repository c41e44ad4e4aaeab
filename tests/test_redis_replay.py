"""A state-changing script sent again with its request id answers as before and changes nothing.

Every script of the Redis frontier and dead-letter store that changes state records its reply
under the call's request id (its last key, ``<base>:req:<id>``; collector/_redis.py). Here each
kind is called through the backend's own API, then the very EVALSHA it made is sent again, as a
resend after a lost reply is: same reply, every key of the backend byte for byte the same (DUMP),
and no new record written. The same EVALSHA with another request id runs anew (a new record;
for most kinds a different reply: the ack now finds its items stale, the claim leases others).
The restart tests (tests/test_redis_restart.py) lose real replies and check the resends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from collector._redis import REPLAY_S, Scripts, lua_source
from collector.deadletter import redis as dl_redis
from collector.deadletter.base import DeadLetter
from collector.deadletter.redis import RedisDeadLetterStore
from collector.frontier import redis as fr_redis
from collector.frontier.base import Completed, DeadLettered, Lease, Offer
from collector.frontier.redis import RedisFrontier

SRC = "src"
T0 = 1_700_000_000.0
URLS = [f"https://example.test/item/{i}" for i in range(10)]

Send = tuple[str, list[Any], list[Any], Any]  # script, keys, args, reply


class Sends:
    """Every script call a backend's :class:`Scripts` sends, with its reply (in order)."""

    def __init__(self, scripts: Scripts) -> None:
        self.made: list[Send] = []
        self.scripts = scripts
        real = scripts.send

        def send(name: str, keys: Any, args: Any) -> Any:
            reply = real(name, keys, args)
            self.made.append((name, list(keys), list(args), reply))
            return reply

        scripts.send = send  # type: ignore[method-assign]  # records what goes out

    def of(self, name: str) -> list[Send]:
        return [s for s in self.made if s[0] == name]


def _snapshot(client: redis.Redis) -> dict[bytes, bytes]:
    """Every key but the reply records, serialised by the server (DUMP)."""
    keys = [k for k in client.scan_iter(count=1000) if b":req:" not in k]
    return {k: client.dump(k) for k in sorted(keys)}  # type: ignore[misc]


def _sets(client: redis.Redis) -> int:
    """SET commands run so far: a script that ran recorded its reply with one (no other SETs)."""
    return int(client.info("commandstats").get("cmdstat_set", {}).get("calls", 0))


def _check_replay(
    client: redis.Redis, scripts: Scripts, made: list[Send], *, differs: bool
) -> None:
    assert made, "the call sent no script of this kind"
    for _, keys, _, _ in made:
        assert b":req:" in keys[-1].encode() and client.ttl(keys[-1]) > REPLAY_S - 60
    before, sets = _snapshot(client), _sets(client)
    for name, keys, args, reply in made:  # a resend: the same EVALSHA, the same request id
        assert scripts.send(name, keys, args) == reply
    assert _sets(client) == sets, "a resend ran again"
    assert _snapshot(client) == before, "a resend changed the data"

    name, keys, args, reply = made[-1]  # the same call with another request id runs anew
    fresh = [*keys[:-1], re.sub(r":req:.*$", ":req:another", keys[-1])]
    again = scripts.send(name, fresh, args)
    if differs:  # it ran: it found the call's work done (a no-op answer is not recorded)
        assert again != reply
    else:  # it ran and recorded its reply, the same as the first time's
        assert again == reply and _sets(client) == sets + 1


# --- the frontier --------------------------------------------------------------------------------
def _rank(url: str, age: float | None, fresh_s: float) -> float:
    return 1.0


def _offer(f: RedisFrontier, *, run_id: str = "r1", ttl: float = 600.0, now: float = T0) -> None:
    offers = [Offer(u, 60.0) for u in URLS]
    f.offer(SRC, offers, now=now, queue_ttl_s=ttl, rank_for=_rank, run_id=run_id)


def _leased(f: RedisFrontier) -> Lease:
    _offer(f)
    return f.claim(SRC, 4, now=T0, lease_s=600, holder="h")


def _dead(f: RedisFrontier) -> Lease:
    lease = _leased(f)
    f.ack(lease, [DeadLettered(i.url, 3, "http_404") for i in lease.items], now=T0)
    return lease


def _done(f: RedisFrontier) -> Lease:
    lease = _leased(f)
    f.ack(lease, [Completed(i.url, T0 + 60, T0) for i in lease.items], now=T0)
    return lease


def _pages(lease: Lease) -> list[Completed]:
    return [Completed(i.url, T0 + 60, T0) for i in lease.items]


@dataclass(frozen=True)
class Case:
    script: str
    prepare: Callable[[RedisFrontier], Any]
    call: Callable[[RedisFrontier, Any], object]
    differs: bool  # a run with another request id answers otherwise (else it answers the same)


FRONTIER_CASES = [
    Case("claim", lambda f: _offer(f), lambda f, _: f.claim(SRC, 4, now=T0, lease_s=60), True),
    Case("ack", _leased, lambda f, lease: f.ack(lease, _pages(lease), now=T0), True),
    Case("renew", _leased, lambda f, lease: f.renew(lease, now=T0, lease_s=900), False),
    Case("release", _leased, lambda f, lease: f.release(lease, now=T0), True),
    Case("revoke", _leased, lambda f, _: f.revoke(SRC, "h", now=T0), True),
    Case(
        "requeue",
        _dead,
        lambda f, lease: f.requeue(SRC, [i.url for i in lease.items], now=T0, queue_ttl_s=60),
        True,
    ),
    Case("revive", _dead, lambda f, lease: f.revive(SRC, _pages(lease)), True),
    Case("make_stale", _done, lambda f, ls: f.make_stale(SRC, [i.url for i in ls.items]), False),
    Case("offer_apply", lambda f: None, lambda f, _: _offer(f), True),
    Case("sweep", _done, lambda f, _: f.sweep(SRC, "r2", retire=True), True),
    Case("sweep_due", _done, lambda f, _: f.sweep(SRC, "r2", retire=True), False),
    Case("unlist", _done, lambda f, _: f.unlist(SRC, URLS, "r2", retire=True), True),
    Case(
        "adopt_tag",
        _done,
        lambda f, _: f.adopt(
            SRC, "r2", now=T0, queue_ttl_s=60, rank_for=_rank, fresh_for=lambda u: 60.0
        ),
        True,
    ),
    Case(
        "renew_queue_ttl",
        lambda f: _offer(f, ttl=10),
        lambda f, _: f.renew_queue_ttl(SRC, now=T0 + 20, queue_ttl_s=60),
        True,
    ),
]


@pytest.fixture
def frontier(redis_url: str) -> Iterator[RedisFrontier]:
    f = RedisFrontier(redis_url)
    yield f
    f.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.mark.parametrize("case", FRONTIER_CASES, ids=lambda c: c.script)
def test_a_frontier_script_sent_again_with_its_id_answers_the_same_and_changes_nothing(
    frontier: RedisFrontier, client: redis.Redis, case: Case
) -> None:
    state = case.prepare(frontier)
    sends = Sends(frontier._scripts)
    case.call(frontier, state)
    _check_replay(client, frontier._scripts, sends.of(case.script), differs=case.differs)


def test_a_claim_and_an_ack_sent_again_answer_as_the_first_time(
    frontier: RedisFrontier, client: redis.Redis
) -> None:
    """What the replay spares: the claim leases no second batch, the ack finds nothing stale."""
    _offer(frontier)
    sends = Sends(frontier._scripts)
    lease = frontier.claim(SRC, 4, now=T0, lease_s=60)
    frontier.ack(lease, _pages(lease), now=T0)
    (claim, ack) = sends.made
    assert frontier._scripts.send(*claim[:3]) == claim[3]
    assert frontier._scripts.send(*ack[:3]) == [4]  # accepted 4, no position stale
    counts = frontier.counts(SRC)
    assert (counts.done, counts.queued, counts.leased) == (4, 6, 0)
    assert client.get("collector:fencing_token") == b"1"  # one claim took a token
    records = [k.decode() if isinstance(k, bytes) else k for k in client.keys("*:req:*")]
    assert len(records) == 3  # the offer's apply, the claim, the ack: each in the source's slot
    assert all(k.startswith("{collector:src}:req:") for k in records)


def test_every_script_says_how_it_is_sent_again() -> None:
    """Replayed scripts start with the replay check and record what they return after a write;
    the others (resent as they are, or never) do neither."""
    for package, module in (("collector.frontier", fr_redis), ("collector.deadletter", dl_redis)):
        assert set(module._SCRIPTS) == module._REPLAYED | module._RESENT, package
        assert not module._REPLAYED & module._RESENT, package
        for name in module._SCRIPTS:
            body = lua_source(package, None, name)
            code = [line for line in body.splitlines() if not line.startswith("--")]
            if name in module._REPLAYED:
                assert code[:2] == [
                    "local again = replayed()  -- a resend of a call that ran: its reply, "
                    "nothing runs again",
                    "if again ~= nil then return again end",
                ], (package, name)
                assert code[-1].startswith("return remember("), (package, name)
            else:
                assert "replayed()" not in body and "remember(" not in body, (package, name)


# --- the dead-letter store -----------------------------------------------------------------------
def _letter(n: int = 1) -> DeadLetter:
    return DeadLetter(SRC, URLS[n], "fetch", "http_500", "boom", 3, T0, T0, id=f"e{n}")


def _escalated(store: RedisDeadLetterStore) -> tuple[str, str]:
    store.put([_letter()])
    store.escalate("e1", "look")
    ((message, entry),) = store.take_for_review(SRC, "ann")
    return message, entry.id


def _claimed(store: RedisDeadLetterStore) -> None:
    store.put([_letter()])
    assert store.claim_for_triage("e1", "ann", now=time.time(), lease_s=60)


@dataclass(frozen=True)
class StoreCase:
    script: str
    prepare: Callable[[RedisDeadLetterStore], Any]
    call: Callable[[RedisDeadLetterStore, Any], object]
    differs: bool
    label: str = ""  # the test id when one script has several cases


STORE_CASES = [
    StoreCase("put", lambda s: None, lambda s, _: s.put([_letter()]), True),
    StoreCase(  # a retried entry failing again adds its attempts once, not per resend
        "put",
        lambda s: s.put([_letter()]) and s.resolve("e1", "reenqueued", "retry", requeued=True),
        lambda s, _: s.put([_letter()]),
        False,
        "put-after-retry",
    ),
    StoreCase(
        "resolve",
        lambda s: s.put([_letter()]),
        lambda s, _: s.resolve("e1", "discarded", "no"),
        True,
    ),
    StoreCase("escalate", lambda s: s.put([_letter()]), lambda s, _: s.escalate("e1", "x"), True),
    StoreCase(
        "finish",
        _escalated,
        lambda s, review: s.finish_review(review[0], review[1], "discarded", "no"),
        True,
    ),
    StoreCase("put_back", _escalated, lambda s, review: s.put_back(review[0], review[1]), True),
    StoreCase("release", _claimed, lambda s, _: s.release_claim("e1", "ann"), True),
]


@pytest.mark.parametrize("case", STORE_CASES, ids=lambda c: c.label or c.script)
def test_a_dead_letter_script_sent_again_with_its_id_answers_the_same_and_changes_nothing(
    redis_url: str, client: redis.Redis, tmp_path: Path, case: StoreCase
) -> None:
    store = RedisDeadLetterStore(redis_url, archive=tmp_path / "dl.jsonl")
    try:
        state = case.prepare(store)
        sends = Sends(store._scripts)
        case.call(store, state)
        _check_replay(client, store._scripts, sends.of(case.script), differs=case.differs)
    finally:
        store.close()
