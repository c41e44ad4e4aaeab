"""Re-planning closes plan refusals whose cause is gone, on both dead-letter stores.

An entry's URL is stored scrubbed (``user:password@`` and secret query values masked), so the
re-plan (``collector.run.replan.LiftedRefusals``) matches it by the digest of its real URL
(``DeadLetter.url_digest``). A seed refused for its credentials is closed once the plan offers
the same URL without them; never while the plan still refuses it, nor when the URL is simply
gone from the seed list. Each test builds the entries as a plan does and runs on a real SQLite
file and a real Redis server (tests/servers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.deadletter import DeadLetter, SqliteDeadLetterStore
from collector.deadletter.base import DeadLetterStore, url_digest
from collector.deadletter.redis import RedisDeadLetterStore
from collector.ops.scrub import Scrubber
from collector.policy.urls import HostPolicy
from collector.run.replan import LiftedRefusals
from collector.run.seeds import SeedCheck

T0 = 1_700_000_000.0
SECRET = "s3cr3t-pw"
PLAIN = "http://127.0.0.1:9/items/1.json"  # an IP literal: judged without DNS
WITH_CREDENTIALS = f"http://bob:{SECRET}@127.0.0.1:9/items/1.json"
OTHER = "http://127.0.0.1:9/items/2.json"


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeadLetterStore]:
    if request.param == "sqlite":
        opened: DeadLetterStore = SqliteDeadLetterStore(tmp_path / "dl.db")
    else:
        opened = RedisDeadLetterStore(request.getfixturevalue("redis_url"))
    with opened:
        yield opened


def refused(url: str, reason: str, *, seen: float = T0, digest: bool = True) -> DeadLetter:
    """A ``plan/refused_url`` entry as ``Collection`` writes it (``digest=False``: as it did
    before entries kept a digest)."""
    return DeadLetter(
        source="src",
        url=Scrubber(()).url(url),
        stage="plan",
        error_class="refused_url",
        message=reason,
        attempts=0,
        first_seen=seen,
        last_seen=seen,
        url_digest=url_digest(url) if digest else "",
    )


def replan(
    store: DeadLetterStore, seeds: list[str], *, private: bool = True, at: float = T0 + 60
) -> int:
    """One plan of ``seeds`` as ``Collection._offer_seeds`` does it: refused seeds are put
    (seen again), accepted ones offered; returns how many old refusals were closed."""
    check = SeedCheck(HostPolicy(allow_private_networks=private))
    lifted = LiftedRefusals(store, "src", check.refusal)
    again = []
    for url in seeds:
        reason = check.refusal(url)
        if reason is not None:
            again.append(refused(url, reason, seen=at))
        elif lifted.pending:
            lifted.offered(url)
    store.put(again)
    return lifted.resolve()


def status(store: DeadLetterStore, entry: DeadLetter) -> tuple[str, str | None]:
    got = store.get(entry.id)
    assert got is not None
    return got.status, got.resolution


def test_a_credential_refusal_is_closed_once_the_url_is_listed_without_them(
    store: DeadLetterStore,
) -> None:
    entry = refused(WITH_CREDENTIALS, "credentials in the URL are not allowed")
    store.put([entry])
    assert SECRET not in entry.url and "bob" not in entry.url
    assert replan(store, [WITH_CREDENTIALS, OTHER]) == 0
    assert status(store, entry) == ("open", None)  # still listed with them: still refused
    assert replan(store, [PLAIN, OTHER]) == 1
    assert status(store, entry) == (
        "resolved", "re-planned: the URL is listed without credentials now"
    )  # fmt: skip


def test_a_credential_refusal_stays_open_while_the_plan_still_refuses_it(
    store: DeadLetterStore,
) -> None:
    """Both forms listed: the plain one is offered, the one with credentials refused again."""
    entry = refused(WITH_CREDENTIALS, "credentials in the URL are not allowed")
    store.put([entry])
    assert replan(store, [PLAIN, WITH_CREDENTIALS]) == 0
    assert status(store, entry) == ("open", None)


def test_a_refusal_whose_url_left_the_seeds_stays_open(store: DeadLetterStore) -> None:
    entry = refused(WITH_CREDENTIALS, "credentials in the URL are not allowed")
    store.put([entry])
    assert replan(store, [OTHER]) == 0
    assert status(store, entry) == ("open", None)


def test_a_masked_query_value_is_matched_by_its_digest(store: DeadLetterStore) -> None:
    """A private host refused with a token in its query: the stored URL masks the token, the
    digest does not, so the same URL offered once private networks are allowed closes it."""
    url = f"http://127.0.0.1:9/items/1.json?token={SECRET}"
    entry = refused(url, "private/loopback address")
    store.put([entry])
    assert SECRET not in entry.url
    assert replan(store, [url], private=False) == 0
    assert replan(store, [url.replace(SECRET, "other")], private=True) == 0  # another URL
    assert status(store, entry) == ("open", None)
    assert replan(store, [url], private=True) == 1
    assert status(store, entry) == ("resolved", "re-planned: the URL policy allows it now")


def test_an_entry_written_before_digests_is_matched_by_its_masked_url(
    store: DeadLetterStore,
) -> None:
    """Stuck entries from before the fix close too: the stored URL, its masked userinfo
    left out, is the URL a fixed seed list offers."""
    entry = refused(WITH_CREDENTIALS, "credentials in the URL are not allowed", digest=False)
    store.put([entry])
    assert replan(store, [WITH_CREDENTIALS]) == 0
    assert replan(store, [PLAIN]) == 1
    assert status(store, entry)[0] == "resolved"
