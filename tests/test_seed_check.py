"""SeedCheck gives the same verdict as HostPolicy.refusal, for any URL, in any order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.policy.urls import HostPolicy
from collector.run.seeds import SeedCheck

_PARTS = st.sampled_from(
    [
        "http://",
        "https://",
        "HTTP://",
        "ftp://",
        "http:/",
        "example.test",
        "allowed.test",
        "Allowed.Test",
        "127.0.0.1",
        "[::1]",
        "[::1",
        ":80",
        ":0",
        ":99999",
        ":x",
        "user:pw@",
        "@",
        "/",
        "/items/1.json",
        "?q=1",
        "#frag",
        " ",
        "\t",
        "\\",
        "%20",
        "é",
        "",
    ]
)
urls = st.lists(_PARTS, min_size=1, max_size=7).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(urls, min_size=1, max_size=30))
def test_same_verdict_as_the_host_policy(batch: list[str]) -> None:
    allowed = ("allowed.test", "127.0.0.1", "::1")
    plain = HostPolicy(allow_private_networks=True, allowed_hosts=allowed)
    check = SeedCheck(HostPolicy(allow_private_networks=True, allowed_hosts=allowed))
    for url in batch + batch:  # the second pass answers from what the first remembered
        assert check.refusal(url) == plain.refusal(url), url


def test_a_remembered_host_still_refuses_a_malformed_url() -> None:
    check = SeedCheck(HostPolicy(allow_private_networks=True))
    assert check.refusal("http://example.test/a") is None
    assert check.refusal("http://example.test/a b") is not None  # whitespace: full check
    assert check.refusal("http://example.test:0/a") is not None  # another netloc
