"""The SQLite frontier's URL key: stored in every file, so it must never change by accident."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from collector.frontier.url_key import url_key


def test_the_numbers_of_one_shape_get_consecutive_keys() -> None:
    keys = [url_key(f"https://api.example.org/v2/items/{i}.json?x=y") for i in range(1000, 1100)]
    assert keys == list(range(keys[0], keys[0] + 100))
    pages = [url_key(f"https://example.org/list?page={i}") for i in range(5)]
    assert pages == list(range(pages[0], pages[0] + 5))


def test_shapes_and_blocks_of_numbers_get_keys_far_apart() -> None:
    one = url_key("https://example.org/items/5.json")
    assert abs(url_key("https://example.org/things/5.json") - one) >= 1 << 24
    assert abs(url_key("https://example.org/items/5.xml") - one) >= 1 << 24
    assert abs(url_key(f"https://example.org/items/{5 + (1 << 24)}.json") - one) >= 1 << 24


def test_keys_are_pinned() -> None:
    # a change of url_key needs a migration of every frontier file (collector.frontier.sqlite)
    assert url_key("https://example.org/items/12345.json") == 640_911_338_352_160_825
    plain = "https://example.org/about"  # no digits: the first 64 bits of SHA-1
    sha1 = hashlib.sha1(plain.encode()).digest()[:8]
    assert url_key(plain) == int.from_bytes(sha1, "big", signed=True)


@given(st.text(max_size=60), st.integers(min_value=0, max_value=10**25), st.text(max_size=10))
def test_a_key_is_a_signed_64_bit_integer_and_the_same_each_time(
    head: str, number: int, tail: str
) -> None:
    url = f"{head}{number}{tail}"
    key = url_key(url)
    assert -(1 << 63) <= key < 1 << 63
    assert url_key(url) == key
