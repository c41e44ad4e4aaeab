"""What a dead letter says about a page a new user's source could not take, against the real
local fault site: the cause, and the setting that decides it, in words a user can act on."""

from __future__ import annotations

import time
from typing import Any

import pytest

from collector.demo.site import FaultSite
from collector.errors import PermanentFetchError
from collector.fetch.engine import FetchEngine, FetchResult
from collector.fetch.transport import TransportKind
from collector.frontier.base import ClaimedItem
from collector.ops.scrub import Scrubber
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy
from collector.settle.letters import Letters
from collector.settle.parse import RecordParser


async def _fetch(
    url: str, transport: TransportKind, max_attempts: int = 2, **options: Any
) -> FetchResult:
    engine = FetchEngine(
        transport=transport,
        retry=RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=max_attempts),
        http_timeout_s=2.0,
        request_deadline_s=3.0,
        **{"host_policy": HostPolicy(allow_private_networks=True), **options},
    )
    async with engine:
        (result,) = await engine.fetch_batch(
            [ClaimedItem(url, 0, None, 0.0)], budget=RetryBudget(ratio=1.0, min_retries=10)
        )
    return result


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_refused_redirect_names_its_target_and_the_setting(
    site: FaultSite, transport: TransportKind
) -> None:
    """The page's own host is allowed; the site redirects elsewhere (www., a CDN): the dead
    letter, listed under the page's URL, must say the redirect is what was refused."""
    policy = HostPolicy(allow_private_networks=True, allowed_hosts=["127.0.0.1"])
    target = f"http://localhost:{site.base_url.rsplit(':', 1)[1]}/items/9.json"
    result = await _fetch(
        site.url(f"/items/1.json?redirect={target}"), transport, host_policy=policy
    )
    assert result.error is not None and result.error.error_class == "refused_url"
    assert str(result.error) == (
        f"redirected to '{target}': host 'localhost' is not in limits.allowed_hosts"
    )


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_page_refused_itself_is_not_called_a_redirect(
    site: FaultSite, transport: TransportKind
) -> None:
    policy = HostPolicy(allow_private_networks=False)
    result = await _fetch(site.url("/items/1.json"), transport, host_policy=policy)
    assert result.error is not None and result.error.error_class == "refused_url"
    assert "redirected" not in str(result.error) and "allow_private_networks" in str(result.error)


async def test_a_body_over_the_cap_names_the_setting_that_sets_it(site: FaultSite) -> None:
    result = await _fetch(
        site.url("/items/5.json?bytes=500000000"), "aiohttp", max_response_bytes=100_000
    )
    assert result.error is not None and result.error.error_class == "too_large"
    assert "the cap of 100000 bytes (limits.max_response_bytes)" in str(result.error)


async def test_a_429_given_up_after_one_try_says_why(site: FaultSite) -> None:
    """Retry-After past retry.max_total_s (900 s by default) ends the page at its first try, with
    attempts left: "HTTP 429" alone would read as a failure retrying could not help."""
    result = await _fetch(
        site.url("/items/1.json?status=429&times=-1&retry_after=5000"), "aiohttp", max_attempts=4
    )
    assert result.error is not None and result.attempts == 1
    letter = Letters("s", "r", Scrubber(), time.time).fetch(result, result.error)
    assert letter.cause == "max_total_exceeded"
    assert letter.message == (
        "HTTP 429 Too Many Requests; given up: waiting Retry-After 5000 s would pass "
        "retry.max_total_s (or a profile's max_duration_s)"
    )

    exhausted = await _fetch(
        site.url("/items/2.json?status=503&times=-1"), "aiohttp", max_attempts=2
    )
    assert exhausted.error is not None and exhausted.attempts == 2
    plain = Letters("s", "r", Scrubber(), time.time).fetch(exhausted, exhausted.error)
    assert plain.message == "HTTP 503 Service Unavailable"  # the attempts say it: 2 of 2


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        (b"<!doctype html><html>Sign in</html>", True),
        (b"\n  <?xml version='1.0'?><items/>", True),
        (b'{"id": 1,', False),
    ],
)
def test_an_html_page_where_json_was_expected_is_said_as_such(body: bytes, hint: bool) -> None:
    """A login or error page, or the site's front end instead of its API: the user must see that
    the page was markup, not hunt for an "unexpected character" in it."""
    with pytest.raises(PermanentFetchError) as info:
        RecordParser().parse("http://127.0.0.1/x", body)
    said = str(info.value)
    assert said.startswith("invalid JSON")
    assert ("(the body starts with '<': an HTML or XML page, not JSON): " in said) is hint, said
