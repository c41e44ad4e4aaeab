"""The Redis frontier's packed expiry lists expire exactly what one entry per URL would.

The Redis frontier keeps, per queue-TTL second, a list of the URLs that expire then, packed
several to an entry with shared-prefix coding (``pack_urls`` / ``unpack_urls`` in
``frontier/lua/prelude.lua``). The plain reference is the SQLite frontier, which keeps one row
per URL and expires by a query: on generated URL sets (shared prefixes of every length, long
rests past the one-byte length, unicode, repeats across offers) and TTLs, both must expire the
same items at the same claims and end in the same counts.
"""

from __future__ import annotations

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.frontier.base import Offer
from collector.frontier.redis import RedisFrontier
from collector.frontier.sqlite import SqliteFrontier

from .conformance import FRESH, SRC, T0, ranked

_PATHS = st.text(alphabet="ab/-09é", max_size=40) | st.builds(
    lambda stem, n: stem * n, st.sampled_from(["x", "ab/", "ü"]), st.integers(80, 400)
)
_URLS = st.builds(
    lambda host, path: f"https://{host}/{path}", st.sampled_from(["a.test", "ab.test"]), _PATHS
)
_OFFERS = st.lists(
    st.tuples(
        st.lists(_URLS, min_size=1, max_size=40),  # one offer's URLs (repeats allowed)
        st.sampled_from([5.0, 30.0, 60.0]),  # its queue TTL
        st.sampled_from([0.0, 1.0, 10.0]),  # time passed before it
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(offers=_OFFERS, checks=st.lists(st.sampled_from([4.0, 6.0, 31.0, 61.0]), max_size=4))
def test_packed_expiry_expires_what_one_row_per_url_expires(
    redis_url: str, offers: list[tuple[list[str], float, float]], checks: list[float]
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    ours, ref = RedisFrontier(redis_url), SqliteFrontier(":memory:")
    try:
        now = T0
        for step, (urls, queue_ttl_s, later) in enumerate(offers):
            now += later
            batch = [Offer(u, FRESH) for u in urls]
            kwargs = dict(now=now, queue_ttl_s=queue_ttl_s, rank_for=ranked(), run_id=f"r{step}")
            assert ours.offer(SRC, batch, **kwargs) == ref.offer(SRC, batch, **kwargs)  # type: ignore[arg-type]
        for later in checks:
            now += later
            got = ours.claim(SRC, 0, now=now, lease_s=60.0)
            want = ref.claim(SRC, 0, now=now, lease_s=60.0)
            assert got.expired == want.expired, (later, got.expired, want.expired)
            assert ours.counts(SRC) == ref.counts(SRC)
        # everything left queued expires at the end, on both
        final_ours = ours.claim(SRC, 0, now=now + 1_000, lease_s=60.0)
        final_ref = ref.claim(SRC, 0, now=now + 1_000, lease_s=60.0)
        assert final_ours.expired == final_ref.expired
        assert ours.counts(SRC) == ref.counts(SRC)
        assert ours.counts(SRC).queued == 0
    finally:
        ours.close()
        ref.close()
