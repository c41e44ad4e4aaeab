"""Conditional requests: fetch a page again only if it changed.

A page's last completed fetch leaves its validators with the frontier item (``ETag`` and
``Last-Modified``, see :class:`collector.frontier.base.Completed`); the next claim hands them
back (:class:`collector.frontier.base.ClaimedItem`) and the request carries them as
``If-None-Match`` / ``If-Modified-Since`` (RFC 9110 section 13). A ``304 Not Modified`` answer
then makes the page fresh again without a body, a parse, a validation or a sink write
(``not_modified`` in the ledger).

What is sent, and why:

* the ETag exactly as the server gave it, weak (``W/"..."``) or strong: If-None-Match compares
  weakly, so a weak tag is as good there, and a tag rewritten by us would never match;
* the Last-Modified text exactly as given, not a parsed and re-formatted date (RFC 9110
  13.1.3: the client should send the value it received); a server that ignores both (answers
  200 again) is handled as any 200;
* nothing at all for a page without validators, and nothing when the source turns them off
  (``politeness.conditional: false``).

What a 304 cannot tell: that the server is honest. A server that answers 304 for a page whose
content changed (a "lying" 304, e.g. an ETag computed from a file's size and time that did not
move, or a cache in front that is out of date) keeps the old records in the sink until the page
is fetched without validators: after ``make_stale`` (``collector compensate`` / ``audit``),
after a revive by triage, or with ``politeness.conditional: false``. See docs/politeness.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from collector.frontier.base import ClaimedItem

__all__ = ["Validators", "after_not_modified", "request_headers", "validators_of"]


class Validators(NamedTuple):
    """A response's validators (None: the response had none)."""

    etag: str | None = None
    last_modified: str | None = None


NONE = Validators()


def request_headers(item: ClaimedItem) -> dict[str, str] | None:
    """The conditional headers for refetching ``item``, or None when none are known."""
    if item.etag is None and item.last_modified is None:
        return None
    headers: dict[str, str] = {}
    if item.etag is not None:
        headers["If-None-Match"] = item.etag
    if item.last_modified is not None:
        headers["If-Modified-Since"] = item.last_modified
    return headers


def validators_of(headers: Mapping[str, str]) -> Validators:
    """The ``ETag`` and ``Last-Modified`` of a response, as given (blank ones are none)."""
    etag = headers.get("etag")
    modified = headers.get("last-modified")
    return Validators(etag.strip() or None if etag else None, modified or None)


def after_not_modified(item: ClaimedItem, answered: Validators) -> Validators:
    """The validators to keep after a 304: the ones it sent (RFC 9110 15.4.5 says a 304
    carries the ETag a 200 would), else the ones the item had."""
    return Validators(
        answered.etag if answered.etag is not None else item.etag,
        answered.last_modified if answered.last_modified is not None else item.last_modified,
    )
