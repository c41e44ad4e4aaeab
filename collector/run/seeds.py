"""Checking seed URLs at planning speed, and telling what a changed template range added.

A plan checks every seed (``HostPolicy.refusal``: the URL's form, then its host). Both parts
parse the URL with ``urlsplit``, ~5 us a URL, which was the largest cost of planning a long
template range. Yet for a URL of the plain form ``scheme://netloc/rest`` (no whitespace, no
userinfo, no backslash) the verdict depends on the scheme and netloc only: the rest cannot make
``urlsplit`` fail or change the host. So :class:`SeedCheck` remembers the *accepted*
``scheme://netloc`` prefixes and lets URLs starting with one through after a regular-expression
match; everything else (other forms, refused URLs, hosts whose resolution failed) takes the full
check every time, so every refusal keeps its own message naming its URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collector.policy.urls import HostPolicy

__all__ = ["RangeChange", "SeedCheck", "range_change"]

# scheme://netloc (group 1) then the path, query or fragment (or nothing); no whitespace or
# control characters, no backslash, no '@' in the netloc
_PLAIN = re.compile(
    r"((?:https?|HTTPS?)://[^/?#@\\\s\x00-\x1f\x7f]+)(?=[/?#]|$)[^\s\x00-\x1f\x7f]*"
)


class SeedCheck:
    """``refusal(url)`` as ``HostPolicy.refusal``, with accepted hosts remembered."""

    def __init__(self, policy: HostPolicy) -> None:
        self.policy = policy
        self._accepted: set[str] = set()

    def refusal(self, url: str) -> str | None:
        """Why ``url`` must not be fetched, or None (raises as ``HostPolicy.refusal`` does)."""
        plain = _PLAIN.fullmatch(url)
        if plain:
            prefix = plain.group(1)
            if prefix in self._accepted:
                return None
            reason = self.policy.refusal(url)
            if reason is None and len(self._accepted) < 10_000:  # bounded memory
                self._accepted.add(prefix)
            return reason
        return self.policy.refusal(url)


@dataclass(frozen=True, slots=True)
class RangeChange:
    """What a template's new range added to the list and what it removed (each a few ranges)."""

    added: tuple[range, ...]
    removed: tuple[range, ...]


def _minus(a: range, b: range) -> tuple[range, ...]:
    """The numbers of ``a`` not in ``b`` (both with step 1), as at most two ranges."""
    parts = (range(a.start, min(a.stop, b.start)), range(max(a.start, b.stop), a.stop))
    return tuple(part for part in parts if len(part))


def range_change(stored: str | None, mark: str) -> RangeChange | None:
    """The difference between two seed marks that differ only in a template's range, or None.

    Marks of template-only lists end in `` range=<start>,<stop>`` (Source.seed_mark); when the
    rest (the digest of the template, ``on_removed``, the host policy) is the same, the lists
    differ exactly by the numbers one range has and the other has not: a template yields a
    different URL for each number, so no URL is in both parts.
    """
    if stored is None:
        return None
    old_digest, _, old_range = stored.partition(" range=")
    new_digest, _, new_range = mark.partition(" range=")
    if not old_range or not new_range or old_digest != new_digest:
        return None
    try:
        old = range(*(int(n) for n in old_range.split(",")))
        new = range(*(int(n) for n in new_range.split(",")))
    except (TypeError, ValueError):
        return None  # not a mark this code wrote: plan in full
    return RangeChange(added=_minus(new, old), removed=_minus(old, new))
