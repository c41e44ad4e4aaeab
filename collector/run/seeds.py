"""Checking seed URLs at planning speed.

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

from collector.policy.urls import HostPolicy

__all__ = ["SeedCheck"]

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
