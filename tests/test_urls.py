"""URL syntax checks and the SSRF host policy (collector.policy.urls). No real DNS lookups of public
names: literals and numeric forms are decided locally, '.invalid' fails fast offline."""

from __future__ import annotations

import threading

import pytest

from collector.errors import PermanentFetchError, RecoverableFetchError
from collector.policy.urls import HostPolicy, check_url_syntax


# --- check_url_syntax ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/file", "scheme 'ftp' is not allowed"),
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
        ("javascript:alert(1)", "scheme 'javascript' is not allowed"),
        ("example.com/items", "not an absolute URL (no scheme://host)"),
        ("//example.com/items", "not an absolute URL (no scheme://host)"),
        ("http//127.0.0.1/x", "not an absolute URL (no scheme://host)"),
        ("http:///path", "has no host"),
        ("http://:8080/path", "has no host"),
        ("https://user@/", "has no host"),
        ("http://exa mple.com/", "contains whitespace"),
        ("http://example.com/a b", "contains whitespace"),
        ("http://example.com/\tx", "contains whitespace"),
        ("http://example.com/\nx", "contains whitespace"),
        (" http://example.com/", "contains whitespace"),
        ("http://example.com:99999/", "malformed URL"),
        ("http://example.com:port/", "malformed URL"),
        ("http://example.com:-1/", "malformed URL"),
        ("http://example.com:0/", "port 0"),
        ("http://[::1/", "malformed URL"),
        ("", "empty URL"),
        ("   ", "empty URL"),
    ],
)
def test_bad_urls_refused_with_reason(url, reason):
    got = check_url_syntax(url)
    assert got is not None
    assert reason in got


def test_non_string_is_refused():
    assert check_url_syntax(None) == "empty URL"  # type: ignore[arg-type]  # the test


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com",
        "https://example.com/items/1.json?page=2#frag",
        "HTTPS://EXAMPLE.COM/",
        "http://example.com:8080/",
        "http://127.0.0.1:65535/",
        "http://[::1]/",
        "https://user:pass@example.com/",
    ],
)
def test_good_urls(url):
    assert check_url_syntax(url) is None


# --- HostPolicy: private networks ----------------------------------------------------------------
PRIVATE = [
    "http://127.0.0.1/",
    "http://127.8.9.10:8080/x",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://0.0.0.0/",
    "http://100.64.0.1/",  # carrier-grade NAT
    "http://224.0.0.1/",  # multicast
    "http://localhost/",
    "http://LOCALHOST:8000/",
    "http://api.localhost/",
    # Numeric forms that the resolver turns into 127.0.0.1 without any network:
    "http://127.1/",
    "http://2130706433/",
]


@pytest.mark.parametrize("url", PRIVATE)
def test_private_hosts_refused(url):
    policy = HostPolicy(allow_private_networks=False)
    reason = policy.refusal(url)
    assert reason is not None
    assert "allow_private_networks" in reason
    with pytest.raises(PermanentFetchError) as info:
        policy.check(url)
    assert info.value.error_class == "refused_url"
    assert info.value.permanent


@pytest.mark.parametrize("url", PRIVATE)
def test_private_hosts_allowed_when_the_source_says_so(url):
    policy = HostPolicy(allow_private_networks=True)
    assert policy.refusal(url) is None
    policy.check(url)


@pytest.mark.parametrize(
    "url", ["http://93.184.216.34/", "https://8.8.8.8/dns", "http://[2606:4700:4700::1111]/"]
)
def test_public_ip_literals_allowed(url):
    policy = HostPolicy(allow_private_networks=False)
    assert policy.refusal(url) is None
    policy.check(url)


def test_bad_syntax_refused_by_policy_too():
    policy = HostPolicy(allow_private_networks=True)
    with pytest.raises(PermanentFetchError, match="scheme 'ftp'") as info:
        policy.check("ftp://93.184.216.34/")
    assert info.value.error_class == "refused_url"


# --- allowed_hosts -------------------------------------------------------------------------------
def test_allowed_hosts_enforced():
    policy = HostPolicy(allow_private_networks=True, allowed_hosts=["Example.COM", "127.0.0.1"])
    assert policy.refusal("http://example.com/a") is None
    assert policy.refusal("http://EXAMPLE.com:8080/a") is None
    assert policy.refusal("http://127.0.0.1/") is None
    reason = policy.refusal("http://other.example.com/")
    assert reason is not None and "allowed_hosts" in reason
    with pytest.raises(PermanentFetchError) as info:
        policy.check("http://evil.test/")
    assert info.value.error_class == "refused_url"


def test_allowed_hosts_do_not_lift_the_private_network_rule():
    policy = HostPolicy(allow_private_networks=False, allowed_hosts=["127.0.0.1", "93.184.216.34"])
    assert policy.refusal("http://93.184.216.34/") is None
    assert policy.refusal("http://127.0.0.1/") is not None
    assert "allowed_hosts" in (policy.refusal("http://10.0.0.1/") or "")


# --- DNS failure ---------------------------------------------------------------------------------
def _refusal_with_timeout(policy: HostPolicy, url: str, timeout: float = 2.0) -> BaseException:
    outcome: list[BaseException | str | None] = []

    def run() -> None:
        try:
            outcome.append(policy.refusal(url))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.skip("getaddrinfo for a .invalid name did not fail within 2 s")
    result = outcome[0]
    assert isinstance(result, BaseException), f"expected an error, got {result!r}"
    return result


def test_unresolvable_host_is_recoverable_dns_error_and_not_cached():
    policy = HostPolicy(allow_private_networks=False)
    url = "http://does-not-exist.invalid/x"
    error = _refusal_with_timeout(policy, url)
    assert isinstance(error, RecoverableFetchError)
    assert error.error_class == "dns_error"
    assert not error.permanent
    assert "does-not-exist.invalid" in str(error)
    assert "does-not-exist.invalid" not in policy._verdicts  # DNS may recover
    # Asked again, it is looked up again (and fails again), not served from the cache.
    again = _refusal_with_timeout(policy, url)
    assert isinstance(again, RecoverableFetchError)


def test_verdicts_are_cached_per_host():
    policy = HostPolicy(allow_private_networks=False)
    assert policy.refusal("http://10.0.0.1/a") is not None
    assert "10.0.0.1" in policy._verdicts
    assert policy.refusal("http://10.0.0.1/b") == policy._verdicts["10.0.0.1"]
