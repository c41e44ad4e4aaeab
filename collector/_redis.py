"""Redis plumbing shared by the Redis frontier and the Redis dead-letter store.

One place decides how Collector talks to Redis, so the two backends cannot drift apart:

* :func:`connect` builds a client with one set of timeouts and health checks, and no automatic
  retries: a script whose reply was lost may have run, and replaying it (an ack, a put) would
  report items stale or count them twice. Stale pooled connections are still re-opened, because
  redis-py checks a pooled connection before handing it out.
* :func:`describe_url` / :func:`describe_client` say where a client points with the password
  masked, for messages and logs.
* :func:`backend_error` turns any redis-py error into one :class:`BackendError` line.
* :class:`Scripts` loads Lua scripts from ``.lua`` files shipped next to the backend (read once
  per process with :mod:`importlib.resources`) and registers them on a client once, so the first
  call of each is a single EVALSHA.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import RedisError
from redis.retry import Retry

from collector.errors import BackendError
from collector.ops.scrub import is_secret_name

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HEALTH_CHECK_INTERVAL_S",
    "SOCKET_TIMEOUT_S",
    "Scripts",
    "backend_error",
    "connect",
    "describe_client",
    "describe_url",
    "lua_source",
    "one_line",
]

# A server that does not answer the TCP handshake in this time is down or unreachable.
CONNECT_TIMEOUT_S = 5.0
# Longest wait for one reply. A claim that expires a large backlog runs for seconds inside Redis;
# a reply that times out leaves the caller unsure whether the script ran, so be generous.
SOCKET_TIMEOUT_S = 60.0
# A pooled connection idle this long is PINGed before use, so a half-open one (a server that
# went away without a FIN, a NAT that dropped the flow) is noticed before a script is sent on it.
HEALTH_CHECK_INTERVAL_S = 30


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (redis-py messages sometimes hold newlines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def backend_error(what: str, exc: BaseException) -> BackendError:
    """The BackendError to raise ``from exc``: ``what`` names the backend, URL and step."""
    return BackendError(f"{what}: {one_line(exc)}")


def describe_url(url: str) -> str:
    """The URL without its password (kept: scheme, user, host, port, db, harmless options)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(n, "***" if is_secret_name(n, in_url=True) else v) for n, v in pairs],
                safe="*",
            )
        if netloc == parts.netloc and query == parts.query:
            return url  # nothing to hide (and urlunsplit would drop unix:// to unix:)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "redis://[unparsable url]"


def describe_client(client: redis.Redis) -> str:
    """Where a ready-made client points (its connection kwargs never print the password)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def connect(url: str, *, what: str) -> redis.Redis:
    """A client for ``url`` with Collector's settings; a malformed URL is a BackendError.

    ``what`` starts the error message (e.g. ``"frontier redis://host:6379/0"``). No connection is
    made here: the caller pings, so that it can say "cannot connect" in its own words.
    """
    try:
        return redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            retry=Retry(NoBackoff(), 0),
        )
    except (ValueError, RedisError) as exc:
        raise backend_error(f"{what}: invalid Redis URL", exc) from exc


@functools.cache
def lua_source(package: str, prelude: str | None, name: str) -> str:
    """Text of ``package``'s ``lua/<name>.lua``, after ``lua/<prelude>.lua`` when given.

    Read once per process: every store of a kind sends the same text (so the same SHA).
    """
    folder = resources.files(package).joinpath("lua")
    body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if prelude is None:
        return body
    return folder.joinpath(f"{prelude}.lua").read_text(encoding="utf-8") + "\n" + body


class Scripts:
    """A backend's Lua scripts, registered on one client; call them by name.

    Construction sends each script once (SCRIPT LOAD), so the first call is one EVALSHA; a server
    that restarted and forgot them gets them again transparently (redis-py's NOSCRIPT fallback).
    """

    def __init__(
        self, client: redis.Redis, package: str, names: Iterable[str], *, prelude: str | None
    ) -> None:
        self._client = client
        self._scripts: dict[str, Script] = {}
        for name in names:
            source = lua_source(package, prelude, name)
            script = client.register_script(source)
            script.sha = client.script_load(source)
            self._scripts[name] = script

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return self._scripts[name](keys=keys, args=args, client=self._client)
