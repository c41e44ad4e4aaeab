"""Secrets removed from everything Collector writes (collector.ops.scrub)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.ops.scrub import REDACTED, Scrubber

PROPS = settings(max_examples=200, deadline=None)

# Secrets and filler text from disjoint alphabets, so a secret cannot appear by accident or
# inside "[redacted]" itself.
secrets = st.text(alphabet="ABCDEFGHJK0123456789", min_size=4, max_size=24)
filler = st.text(alphabet="lmnopqrstuvwxyz ,.:;-_/", max_size=30)


# --- known values --------------------------------------------------------------------------------
def test_known_value_redacted_in_strings_dicts_and_lists():
    scrub = Scrubber(["s3cr3t-T0KEN"])
    data: dict[str, Any] = {
        "message": "request failed with header Bearer s3cr3t-T0KEN",
        "nested": {"list": ["a", "xs3cr3t-T0KENx", 3, None], "tuple": ("s3cr3t-T0KEN",)},
        "number": 12,
    }
    assert scrub(data) == {
        "message": f"request failed with header Bearer {REDACTED}",
        "nested": {"list": ["a", f"x{REDACTED}x", 3, None], "tuple": [REDACTED]},
        "number": 12,
    }
    assert data["message"].endswith("s3cr3t-T0KEN")  # the input is not modified


@PROPS
@given(
    values=st.lists(secrets, min_size=1, max_size=4),
    parts=st.lists(filler, min_size=1, max_size=5),
    data=st.data(),
)
def test_known_values_never_survive(values, parts, data):
    scrub = Scrubber(values)
    pieces = []
    for part in parts:
        pieces.append(part)
        pieces.append(data.draw(st.sampled_from(values)))
    text = "".join(pieces)
    document = {"text": text, "items": [text, {"deeper": [text]}]}
    out = scrub(document)
    flat = repr(out)
    for value in values:
        assert value not in flat


def test_longest_secret_first():
    scrub = Scrubber(["abcd", "abcdefgh"])
    assert scrub("x abcdefgh y abcd z") == f"x {REDACTED} y {REDACTED} z"
    # Order of the given values does not matter.
    assert Scrubber(["abcdefgh", "abcd"])("abcdefgh") == REDACTED


@pytest.mark.parametrize("short", ["", "a", "ab", "abc"])
def test_short_values_ignored(short):
    scrub = Scrubber([short])
    assert scrub("abc and ab and a") == "abc and ab and a"


def test_four_characters_is_enough():
    assert Scrubber(["abcd"])("xabcdx") == f"x{REDACTED}x"


def test_regex_metacharacters_in_secrets_are_literal():
    scrub = Scrubber(["a.b*c(d"])
    assert scrub("a.b*c(d") == REDACTED
    assert scrub("aXbbbc(d") == "aXbbbc(d"


def test_add_returns_a_scrubber_with_both():
    first = Scrubber(["first-secret"])
    both = first.add("second-secret")
    assert both("first-secret second-secret") == f"{REDACTED} {REDACTED}"
    assert first("second-secret") == "second-secret"  # the original is unchanged


# --- URLs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["token", "api_key", "password", "sig", "access_token", "apikey"])
def test_secret_query_params_redacted_others_kept(name):
    scrub = Scrubber()
    url = f"https://api.example.com/v1/items?page=2&{name}=hunter22&q=red+shoes"
    out = scrub(url)
    assert "hunter22" not in out
    parts = urlsplit(out)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "api.example.com", "/v1/items")
    assert parse_qsl(parts.query) == [("page", "2"), (name, REDACTED), ("q", "red shoes")]


def test_query_without_secret_names_untouched():
    url = "https://example.com/search?q=a%20b&page=3&sort=asc"
    assert Scrubber()(url) == url


def test_url_inside_free_text():
    text = 'GET https://x.example/items?id=4&token=abc123 failed; see "https://y/?q=1"'
    out = Scrubber()(text)
    assert "abc123" not in out
    assert out.startswith("GET https://x.example/items?id=4&token=")
    assert out.endswith('failed; see "https://y/?q=1"')


def test_userinfo_redacted_by_url():
    scrub = Scrubber()
    assert scrub.url("https://bob:hunter22@example.com/a") == f"https://{REDACTED}@example.com/a"
    assert "hunter22" not in scrub("https://bob:hunter22@example.com/a?page=1")


def test_userinfo_redacted_in_text_without_query():
    out = Scrubber()("connecting to https://bob:hunter22@db.example.com:5432/items")
    assert "hunter22" not in out


# --- dict keys -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    [
        "Authorization",
        "authorization",
        "api_key",
        "X-Api-Key",
        "apikey",
        "password",
        "passwd",
        "client_secret",
        "Cookie",
        "Set-Cookie",
        "session_id",
        "access_key",
        "private_key",
        "refresh_token",
    ],
)
def test_secret_named_keys_redacted(key):
    out = Scrubber()({key: "anything at all", "url": "https://x/", "count": 3})
    assert out == {key: REDACTED, "url": "https://x/", "count": 3}


def test_secret_named_key_redacts_whole_nested_value():
    out = Scrubber()({"headers": {"Authorization": "Bearer x", "Accept": "json"}, "auth": {"u": 1}})
    assert out == {"headers": {"Authorization": REDACTED, "Accept": "json"}, "auth": REDACTED}


def test_empty_secret_values_left_as_they_are():
    assert Scrubber()({"password": "", "token": None}) == {"password": "", "token": None}


# --- non-secret data -----------------------------------------------------------------------------
json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet="abcdefxyz 0123456789-_./:", max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet="xyzbqwm_", max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@PROPS
@given(value=json_like)
def test_non_secret_data_unchanged(value):
    assert Scrubber(["ZZZZ-secret"])(value) == value


def test_non_secret_examples_unchanged():
    record = {
        "id": 17,
        "title": "Ordinary text: price 9.99, in stock",
        "url": "https://example.com/items/17?page=2",
        "tags": ["new", "sale"],
        "ratio": 0.5,
        "ok": True,
        "missing": None,
    }
    assert Scrubber(["not-present-anywhere"])(record) == record


def test_ordinary_names_containing_secret_words_kept():
    scrub = Scrubber()
    record = {"compass": "N", "passenger_count": 3, "author": "Ann"}
    assert scrub(record) == record
    url = "https://example.com/shop?design=blue&page=1"
    assert scrub(url) == url
