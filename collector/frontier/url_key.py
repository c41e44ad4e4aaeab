"""The 64-bit key by which the SQLite frontier finds a URL, chosen so URL lists insert in order.

The frontier's URL index (``items_url`` on ``(src, h)``) only needs a key that is the same for
the same URL and rarely shared by two (a shared key is told apart by comparing the URLs). A
plain hash does that, but scatters the keys: each new URL of a plan lands on a random page of
the index, so a transaction of 2,000 new URLs dirties ~2,000 pages that the WAL then writes out.
At a million URLs that was most of the plan's time (about 8 of 12 CPU seconds in SQLite).

Seed lists are mostly URLs that differ in one number (``/items/{i}.json``, ``?page={i}``).
So the key is made of two parts: the high 40 bits hash everything *but* the URL's last run of
ASCII digits (its *shape*, plus the number's bits above the low 24), the low 24 bits are that
number. Consecutive numbers of one shape get consecutive keys, so a template range is written to
the index in order, like appends. Two URLs share a key only when their shapes' 40-bit hashes
collide (or numbers differ only in leading zeros): a comparison of the URLs settles those. A URL
with no digits (or a run longer than 18) gets the first 64 bits of its SHA-1, as before.

The key is stored: changing this function needs a migration of the frontier file (schema 3 in
:mod:`collector.frontier.sqlite` recomputes it).
"""

from __future__ import annotations

import hashlib
from string import digits

__all__ = ["url_key"]

_LOW_BITS = 24
_LOW_MASK = (1 << _LOW_BITS) - 1
_NOT_DIGITS = "".join(chr(c) for c in range(128) if chr(c) not in digits)
_SHAPES_KEPT = 4_096  # shapes remembered (a template has one); bounded memory for any list
_shapes: dict[tuple[str, str, int], int] = {}


def _sha1_64(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big", signed=True)


def url_key(url: str) -> int:
    """The URL's key: a signed 64-bit integer (SQLite's INTEGER), the same in every process."""
    body = url.rstrip(_NOT_DIGITS)  # up to the last ASCII digit (non-ASCII tails: no digits)
    head = body.rstrip(digits)
    run = body[len(head) :]
    if not run or len(run) > 18:
        return _sha1_64(url)
    number = int(run)
    shape = (head, url[len(body) :], number >> _LOW_BITS)
    top = _shapes.get(shape)
    if top is None:
        if len(_shapes) >= _SHAPES_KEPT:
            _shapes.clear()
        text = f"{head}\x00{shape[2]}\x00{shape[1]}"
        digest = int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:5], "big")
        # the 40 bits in the high part of a signed 64-bit integer; its low 24 bits are zero
        top = _shapes[shape] = (digest << _LOW_BITS) - (1 << 63)
    return top | (number & _LOW_MASK)
