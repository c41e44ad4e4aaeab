"""Freshness rules and hooks, and the alignment of the four TTLs (collector.policy.ttl)."""

from __future__ import annotations

import textwrap
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from collector import defaults
from collector.errors import ConfigError
from collector.policy.ttl import FreshnessRule, TTLSettings

ALIGNED = {"http_timeout_s": 5, "request_deadline_s": 10, "batch_timeout_s": 60, "lease_s": 120}


def _hook_module(tmp_path, monkeypatch, body: str) -> str:
    """Write a hook module into tmp_path, put it on sys.path, return its unique name."""
    name = f"ttl_hook_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# --- rules ---------------------------------------------------------------------------------------
def test_defaults():
    ttl = TTLSettings()
    assert ttl.default_fresh_s == defaults.DEFAULT_FRESH_S
    assert ttl.fresh_for("https://x/anything") == defaults.DEFAULT_FRESH_S
    assert ttl.lease_s == defaults.LEASE_S


def test_first_matching_rule_wins():
    ttl = TTLSettings(
        default_fresh_s=100,
        rules=(
            FreshnessRule(pattern=r"/live/", fresh_s=5),
            FreshnessRule(prefix="https://x/archive/", fresh_s=86400),
            FreshnessRule(pattern=r"\.json$", fresh_s=600),
            FreshnessRule(prefix="https://x/", fresh_s=1),
        ),
    )
    assert ttl.fresh_for("https://x/archive/live/a.json") == 5  # regex searched, not matched
    assert ttl.fresh_for("https://x/archive/a.json") == 86400
    assert ttl.fresh_for("https://x/items/a.json") == 600
    assert ttl.fresh_for("https://x/items/a.html") == 1
    assert ttl.fresh_for("https://y/items/a.html") == 100  # default


def test_prefix_is_plain_text_not_a_regex():
    ttl = TTLSettings(default_fresh_s=9, rules=(FreshnessRule(prefix="https://x/a.b", fresh_s=1),))
    assert ttl.fresh_for("https://x/a.b/c") == 1
    assert ttl.fresh_for("https://x/aXb/c") == 9
    # A prefix must match at the start.
    assert ttl.fresh_for("http://mirror/https://x/a.b") == 9


@settings(max_examples=200, deadline=None)
@given(
    hits=st.lists(st.booleans(), min_size=0, max_size=6),
    values=st.lists(st.floats(min_value=0, max_value=1e6), min_size=6, max_size=6),
)
def test_first_match_property(hits, values):
    url = "https://x/page"
    rules = tuple(
        FreshnessRule(pattern="page" if hit else "nomatch", fresh_s=v)
        for hit, v in zip(hits, values, strict=False)
    )
    ttl = TTLSettings(default_fresh_s=42, rules=rules)
    expected = next((v for hit, v in zip(hits, values, strict=False) if hit), 42)
    assert ttl.fresh_for(url) == expected


def test_zero_freshness_allowed():
    assert TTLSettings(default_fresh_s=0).fresh_for("https://x/") == 0
    assert FreshnessRule(prefix="https://x/", fresh_s=0).fresh_s == 0


# --- hook ----------------------------------------------------------------------------------------
def test_hook_asked_first_and_none_falls_through(tmp_path, monkeypatch):
    module = _hook_module(
        tmp_path,
        monkeypatch,
        """
        def fresh(url):
            if "hot" in url:
                return 2
            if "negative" in url:
                return -50
            return None
        """,
    )
    ttl = TTLSettings(
        hook=f"{module}:fresh",
        default_fresh_s=300,
        rules=(FreshnessRule(pattern="hot|rule", fresh_s=30),),
    )
    ttl.validate_hook()
    assert ttl.fresh_for("https://x/hot") == 2  # hook wins over the matching rule
    assert ttl.fresh_for("https://x/rule") == 30  # None -> rules
    assert ttl.fresh_for("https://x/other") == 300  # None -> default
    assert ttl.fresh_for("https://x/negative") == 0.0  # clamped at zero


def test_hook_dotted_without_colon(tmp_path, monkeypatch):
    module = _hook_module(tmp_path, monkeypatch, "def fresh(url):\n    return 7\n")
    assert TTLSettings(hook=f"{module}.fresh").fresh_for("https://x/") == 7.0


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("no_such_module_xyz:fresh", "cannot import module 'no_such_module_xyz'"),
        ("nodots", "is not a dotted path"),
    ],
)
def test_bad_hook_is_config_error(hook, message):
    ttl = TTLSettings(hook=hook)
    with pytest.raises(ConfigError, match=message) as info:
        ttl.validate_hook()
    assert str(info.value).startswith("ttl.hook: ")


def test_hook_missing_attribute_or_not_callable(tmp_path, monkeypatch):
    module = _hook_module(tmp_path, monkeypatch, "VALUE = 3\n")
    with pytest.raises(ConfigError, match="has no attribute 'fresh'"):
        TTLSettings(hook=f"{module}:fresh").validate_hook()
    with pytest.raises(ConfigError, match="is not callable"):
        TTLSettings(hook=f"{module}:VALUE").validate_hook()


# --- rule validation -----------------------------------------------------------------------------
def test_invalid_regex_error_text():
    with pytest.raises(ValidationError) as info:
        FreshnessRule(pattern="items/(", fresh_s=1)
    text = str(info.value)
    assert "invalid regular expression 'items/('" in text
    assert "missing )" in text


@pytest.mark.parametrize(
    "kwargs", [{"fresh_s": 1}, {"pattern": "a", "prefix": "https://x/", "fresh_s": 1}]
)
def test_exactly_one_of_pattern_or_prefix(kwargs):
    with pytest.raises(ValidationError, match="exactly one of 'pattern'"):
        FreshnessRule(**kwargs)


def test_rule_negative_freshness_refused():
    with pytest.raises(ValidationError):
        FreshnessRule(prefix="https://x/", fresh_s=-1)


def test_rule_unknown_key_refused():
    with pytest.raises(ValidationError):
        FreshnessRule(prefix="https://x/", fresh_s=1, fresh=2)  # type: ignore[call-arg]  # the test


# --- alignment -----------------------------------------------------------------------------------
def test_aligned_settings_load():
    ttl = TTLSettings(**ALIGNED)
    assert ttl.batch_timeout_s < ttl.lease_s


def test_equal_bounds_allowed_where_order_is_non_strict():
    ttl = TTLSettings(http_timeout_s=10, request_deadline_s=10, batch_timeout_s=10, lease_s=11)
    assert ttl.lease_s == 11


@pytest.mark.parametrize(
    ("override", "lower", "upper"),
    [
        ({"http_timeout_s": 11}, "http_timeout_s", "request_deadline_s"),
        ({"request_deadline_s": 61}, "request_deadline_s", "batch_timeout_s"),
        ({"batch_timeout_s": 200}, "batch_timeout_s", "lease_s"),
        ({"lease_s": 60}, "batch_timeout_s", "lease_s"),  # equal is not enough
        ({"lease_s": 30}, "batch_timeout_s", "lease_s"),
    ],
)
def test_each_violated_inequality_names_both_fields(override, lower, upper):
    with pytest.raises(ValidationError) as info:
        TTLSettings(**{**ALIGNED, **override})
    message = str(info.value)
    assert lower in message and upper in message


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=0.001, max_value=1e6), min_size=4, max_size=4))
def test_alignment_property(values):
    http, request, batch, lease = values
    aligned = http <= request <= batch < lease
    kwargs = {
        "http_timeout_s": http,
        "request_deadline_s": request,
        "batch_timeout_s": batch,
        "lease_s": lease,
    }
    if aligned:
        TTLSettings(**kwargs)
    else:
        with pytest.raises(ValidationError):
            TTLSettings(**kwargs)


@pytest.mark.parametrize(
    "field",
    ["queue_ttl_s", "http_timeout_s", "request_deadline_s", "batch_timeout_s", "lease_s"],
)
@pytest.mark.parametrize("value", [0, -1, -0.5])
def test_non_positive_durations_refused(field, value):
    with pytest.raises(ValidationError) as info:
        TTLSettings(**{**ALIGNED, field: value})
    assert field in str(info.value)


def test_negative_default_freshness_refused():
    with pytest.raises(ValidationError, match="default_fresh_s"):
        TTLSettings(default_fresh_s=-1)


def test_unknown_key_refused():
    with pytest.raises(ValidationError, match="leas_s"):
        TTLSettings(leas_s=3)  # type: ignore[call-arg]  # the misspelt key is the test


@pytest.mark.parametrize("lease", [3.0, 600.0, 1000.0])
def test_renew_every_is_a_third_of_the_lease(lease):
    ttl = TTLSettings(http_timeout_s=0.5, request_deadline_s=1, batch_timeout_s=2, lease_s=lease)
    assert ttl.renew_every_s == pytest.approx(lease / 3)
