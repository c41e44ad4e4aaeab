"""Hostile servers against the fetch engine: each answer ends as one clear result, never a hang,
a crash of the batch or an unbounded read.

A real local server (stdlib, a thread) misbehaves on purpose: a gzip bomb whose compressed size
is tiny (so the Content-Length check cannot see it), a body dripped a byte at a time, a redirect
loop, a body shorter than its Content-Length, and a header block larger than any sane limit.
Every case runs on both connection pools.

The engine decodes the raw body within the cap (collector.fetch.decoding), so the bomb never
exists decoded past it on either pool; the check is Python's traced allocations (exact, unlike
RSS): at the peak 4.7 MB on httpx's pool and 2.2 MB on aiohttp's, against 148 MB and 48 MB when
the engine read httpx's ``aiter_bytes`` (a whole network read inflated at once). Peak RSS, from
bench/decoding.py (fresh processes, 2026-12-03, load 1.8): +64.1 MB for the bomb on httpx's pool
with httpx's decoding, +0.0 MB with the engine's on either pool.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator

import pytest

from collector.fetch.engine import FetchEngine, FetchResult
from collector.fetch.transport import TransportKind
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from tests.hostile_site import BOMB, CAP, PAGE, HostileSite


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    with HostileSite() as site:
        yield site.base_url


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> TransportKind:
    kind: TransportKind = request.param
    return kind


async def _fetch(transport: TransportKind, url: str, *, cap: int = CAP) -> FetchResult:
    engine = FetchEngine(
        transport=transport,
        retry=RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=2, max_inline_delay_s=1),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=2.0,
        request_deadline_s=1.0,
        max_response_bytes=cap,
        max_redirects=5,
    )
    async with engine:
        (result,) = await engine.fetch_batch(
            [ClaimedItem(url, 0, None, 0.0)], budget=RetryBudget(ratio=1.0, min_retries=100)
        )
    return result


async def test_a_gzip_bomb_is_cut_off_at_the_cap_of_decoded_bytes(
    hostile: str, transport: TransportKind
) -> None:
    assert len(BOMB) < CAP  # the declared length passes: only the decoded size can catch it
    result = await _fetch(transport, f"{hostile}/bomb")
    assert result.status == "failed" and result.error is not None, result
    assert result.error.error_class == "too_large", result.error
    assert result.error.status_code == 200  # what the server answered, kept on the dead letter
    assert result.decision is not None and result.decision.action == "dead"


async def test_a_dripped_body_ends_at_the_request_deadline(
    hostile: str, transport: TransportKind
) -> None:
    began = time.monotonic()
    result = await _fetch(transport, f"{hostile}/drip")
    assert time.monotonic() - began < 10  # two attempts of 1 s, not the drip's 50 s
    assert result.status == "failed" and result.error is not None, result
    assert result.error.error_class == "timeout", result.error


async def test_a_redirect_loop_ends_as_one_clear_failure(
    hostile: str, transport: TransportKind
) -> None:
    result = await _fetch(transport, f"{hostile}/loop")
    assert result.status == "failed" and result.error is not None, result
    assert "redirect" in str(result.error).lower(), result.error
    assert result.decision is not None and result.decision.action == "dead"


async def test_a_body_shorter_than_its_length_is_a_failure_not_a_record(
    hostile: str, transport: TransportKind
) -> None:
    result = await _fetch(transport, f"{hostile}/short")
    assert result.status == "failed" and result.error is not None, result


async def test_an_oversized_header_block_is_a_failure_not_a_crash(
    hostile: str, transport: TransportKind
) -> None:
    result = await _fetch(transport, f"{hostile}/headers")
    # 200 KB of headers: aiohttp refuses them (its limit is 8 KB a line), httpx's h11 too
    # (64 KB); either way one failed result, and the batch goes on.
    assert result.status == "failed" and result.error is not None, result


async def test_a_gzip_bomb_never_exists_decoded_past_the_cap(
    hostile: str, transport: TransportKind
) -> None:
    """Python's allocations while the bomb is fetched stay near the cap (traced, so exact):
    the body is decoded within what is left of the cap, not a whole network read at once
    (httpx's aiter_bytes: ~64 MB at once on httpx's pool, ~16 MB a 16 KB read on aiohttp's)."""
    tracemalloc.start()
    try:
        result = await _fetch(transport, f"{hostile}/bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.error is not None and result.error.error_class == "too_large", result
    assert peak < 8 * CAP, f"{peak / 1e6:.1f} MB traced at the peak"


@pytest.mark.parametrize(
    "encodings", ["gzip", "deflate", "rawdeflate", "gzip,deflate", "bogus", "gzip,bogus"]
)
async def test_encoded_bodies_are_decoded_as_httpx_decodes_them(
    hostile: str, transport: TransportKind, encodings: str
) -> None:
    result = await _fetch(transport, f"{hostile}/encoded?{encodings}")
    assert result.status == "ok", result
    assert result.body == PAGE


async def test_a_corrupt_encoded_body_is_one_permanent_decode_error(
    hostile: str, transport: TransportKind
) -> None:
    result = await _fetch(transport, f"{hostile}/encoded?corrupt")
    assert result.error is not None and result.error.error_class == "decode_error", result
    assert str(result.error).startswith("cannot decode response body: ")
    assert result.decision is not None and result.decision.action == "dead"


async def test_a_decoded_body_over_the_cap_is_too_large_even_when_well_compressed(
    hostile: str, transport: TransportKind
) -> None:
    engine_cap = len(PAGE) - 1  # one byte short: the decoded size is what counts
    result = await _fetch(transport, f"{hostile}/encoded?gzip", cap=engine_cap)
    assert result.error is not None and result.error.error_class == "too_large", result
