"""URLs with credentials (``user:password@host``) are refused by the URL policy, everywhere.

httpx/aiohttp cannot combine URL credentials with an ``Authorization`` header, so one such seed
crashed every run of its source; and a password in a URL leaks into logs and dead letters. The
policy refuses them at plan (one ``refused_url`` dead letter, the rest stored), ``validate`` warns,
a redirect to one is refused, and no message shows the password.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import load_source, source_warnings
from collector.deadletter import SqliteDeadLetterStore
from collector.demo.site import FaultSite
from collector.errors import PermanentFetchError
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy, check_url_syntax, shown
from collector.run.seeds import SeedCheck
from flows.collect import collect
from tests.helpers import summary_of, write_source

SECRET = "s3cr3t-pw"
HINT = "credentials in the URL are not allowed"


@pytest.mark.parametrize(
    "url",
    [
        f"http://bob:{SECRET}@127.0.0.1:8080/items/3.json",
        "http://bob@127.0.0.1/items/3.json",
        f"http://:{SECRET}@127.0.0.1/",
        f"https://bob:a@{SECRET}@example.test/x",  # '@' in the password: userinfo ends at the last
        "http://@127.0.0.1/",
    ],
)
def test_urls_with_userinfo_are_refused_without_showing_it(url: str) -> None:
    policy = HostPolicy(allow_private_networks=True)
    for check in (policy.refusal, SeedCheck(policy).refusal):
        reason = check(url)
        assert reason is not None and HINT in reason and "limits.headers" in reason
        assert SECRET not in reason and "bob" not in reason
        assert "[redacted]@" in reason


def test_the_syntax_check_alone_still_accepts_userinfo() -> None:
    """Credentials are a policy refusal (dead-lettered at plan), not a malformed seed list."""
    assert check_url_syntax(f"http://bob:{SECRET}@example.test/") is None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"http://bob:{SECRET}@h/x", "'http://[redacted]@h/x'"),
        (f"http//bob:{SECRET}@h/x", "'http//[redacted]@h/x'"),  # no scheme: still masked
        (f"bob:{SECRET}@h:1/x", "'[redacted]@h:1/x'"),
        ("http://h/users/@bob", "'http://h/users/@bob'"),  # '@' in a path is not userinfo
        ("http://h?q=a@b", "'http://h?q=a@b'"),
    ],
)
def test_shown_masks_userinfo_only(url: str, expected: str) -> None:
    assert shown(url) == expected


def test_other_refusals_do_not_show_the_password_either() -> None:
    for url in (
        f"ftp://bob:{SECRET}@example.test/",
        f"http://bob:{SECRET}@example.test/a b",
        f"http//bob:{SECRET}@example.test/",
    ):
        reason = check_url_syntax(url)
        assert reason is not None and SECRET not in reason, reason


def test_check_request_refuses_userinfo() -> None:
    policy = HostPolicy(allow_private_networks=True)
    with pytest.raises(PermanentFetchError) as info:
        policy.check_request("http", "127.0.0.1", f"http://bob:{SECRET}@127.0.0.1/x")
    assert info.value.error_class == "refused_url" and SECRET not in str(info.value)
    policy.check_request("http", "127.0.0.1", "http://127.0.0.1/users/@bob")  # allowed


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_redirect_to_a_url_with_credentials_is_refused(
    site: FaultSite, transport: str
) -> None:
    port = site.base_url.rsplit(":", 1)[1]
    target = f"http://bob:{SECRET}@127.0.0.1:{port}/items/9.json"
    engine = FetchEngine(
        transport=transport,  # type: ignore[arg-type]  # parametrized literal
        retry=RetrySettings(base_s=0.01, cap_s=0.05, max_attempts=3, max_inline_delay_s=2),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=2.0,
        request_deadline_s=3.0,
    )
    async with engine:
        (result,) = await engine.fetch_batch(
            [ClaimedItem(site.url(f"/items/1.json?redirect={target}"), 0, None, 0.0)],
            budget=RetryBudget(ratio=1.0, min_retries=100),
        )
    assert result.error is not None and result.error.error_class == "refused_url"
    assert HINT in str(result.error) and SECRET not in str(result.error)
    assert site.request_count("/items/9.json") == 0


def test_validate_warns_about_a_seed_with_credentials(tmp_path: Path) -> None:
    good = "http://127.0.0.1:9/items/1.json"
    path = write_source(
        tmp_path, seeds={"urls": [good, f"http://bob:{SECRET}@127.0.0.1:9/items/3.json"]}
    )
    warnings = source_warnings(load_source(path))
    assert len(warnings) == 1, warnings
    assert "1 of the first 2 seed URLs would be refused" in warnings[0]
    assert HINT in warnings[0] and SECRET not in warnings[0]


@pytest.mark.usefixtures("prefect_api")
async def test_a_seed_with_credentials_is_dead_lettered_and_the_others_are_stored(
    tmp_path: Path, site: FaultSite
) -> None:
    port = site.base_url.rsplit(":", 1)[1]
    # An Authorization header as well: the combination crashed every run before the fix.
    source_path = write_source(
        tmp_path,
        seeds={
            "urls": [
                site.url("/items/1.json"),
                site.url("/items/2.json"),
                f"http://bob:{SECRET}@127.0.0.1:{port}/items/3.json",
            ]
        },
        limits={"headers": {"Authorization": "Bearer abcdefgh"}},
    )
    summary = summary_of(await collect(source=str(source_path)))
    assert summary["stored"] == 2 and summary["dead_lettered"] == 1 and summary["queued"] == 0
    assert summary["refused_at_plan"] == 1 and summary["balanced"]
    assert summary["deadletter_reasons"] == {"plan/refused_url": 1}
    assert site.request_count("/items/3.json") == 0

    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        (letter,) = store.list(source=source.name)
    finally:
        store.close()
    assert HINT in letter.message
    assert SECRET not in letter.message and SECRET not in letter.url
    assert letter.url.endswith(f"@127.0.0.1:{port}/items/3.json")


@pytest.mark.usefixtures("prefect_api")
async def test_the_refusal_closes_once_the_seed_is_listed_without_its_credentials(
    tmp_path: Path, site: FaultSite
) -> None:
    """The entry keeps the URL masked, so the re-plan matches it by the digest of the real URL
    without its userinfo: moving the credentials to a header (what the refusal asks) closes it
    and the page is collected; listing both forms keeps it open."""
    port = site.base_url.rsplit(":", 1)[1]
    plain = site.url("/items/3.json")
    with_credentials = f"http://bob:{SECRET}@127.0.0.1:{port}/items/3.json"
    seeds = [site.url("/items/1.json"), with_credentials]
    source_path = write_source(tmp_path, seeds={"urls": seeds})
    first = summary_of(await collect(source=str(source_path)))
    assert (first["refused_at_plan"], first["stored"]) == (1, 1)

    # both forms listed: a difference plan offers the new line only; the credential form, still
    # listed in the unchanged lines, keeps its entry open (not refused again: not offered)
    write_source(tmp_path, seeds={"urls": [*seeds, plain]})
    both = summary_of(await collect(source=str(source_path)))
    assert both["plan"] == "difference"
    assert (both["refused_at_plan"], both["replanned"], both["stored"]) == (0, 0, 1)
    assert both["deadletter_reasons"] == {"plan/refused_url": 1}

    write_source(
        tmp_path,
        seeds={"urls": [site.url("/items/1.json"), plain]},
        limits={"headers": {"Authorization": "Basic Ym9iOnMzY3IzdC1wdw=="}},
    )
    fixed = summary_of(await collect(source=str(source_path)))
    assert (fixed["refused_at_plan"], fixed["replanned"]) == (0, 1)
    assert fixed["deadletter_reasons"] == {} and fixed["balanced"]

    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        (letter,) = store.list(source=source.name, status=None)
    finally:
        store.close()
    assert (letter.status, letter.resolution_kind) == ("resolved", "reenqueued")
    assert letter.resolution == "re-planned: the URL is listed without credentials now"
    assert SECRET not in letter.url and SECRET not in letter.url_digest
