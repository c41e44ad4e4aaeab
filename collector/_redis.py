"""Redis plumbing shared by the Redis frontier and the Redis dead-letter store.

One place decides how Collector talks to Redis, so the two backends cannot drift apart:

* :func:`connect` builds a client with one set of timeouts and health checks that rides out a
  Redis restart (below) but never sends a command again that may have run.
* :func:`describe_url` / :func:`describe_client` say where a client points with the password
  masked, for messages and logs.
* :func:`backend_error` turns any redis-py error into one :class:`BackendError` line.
* :class:`Scripts` loads Lua scripts from ``.lua`` files shipped next to the backend (read once
  per process with :mod:`importlib.resources`) and registers them on a client once, so the first
  call of each is a single EVALSHA; it sends a call again whose reply was lost when the script
  says that is safe (below).

**A Redis restart.** While a server the client has reached before is down or loading its data, a
call waits for it, up to ``reconnect_s`` (:data:`RECONNECT_S`, env
``COLLECTOR_REDIS_RECONNECT_S``), with redis-py's :class:`~redis.retry.Retry` and
:class:`~redis.backoff.ExponentialWithJitterBackoff`; after that it fails with one line. A server
never reached fails the first call at once (a wrong URL, a server not started). Only what cannot
have changed anything is retried inside redis-py, so every command runs at most once:

* *making a connection* (TCP connect and redis-py's handshake: HELLO/AUTH/SELECT/CLIENT SETINFO,
  all idempotent): nothing of the caller's has been sent yet. This covers a pooled connection the
  server closed when it stopped (redis-py finds it readable before use and reconnects) and the
  connection refused while it is down;
* a failed *health-check PING* (sent before a command on a connection idle past
  :data:`HEALTH_CHECK_INTERVAL_S`): the command was not sent; the connection is made again;
* a command the server refused with ``LOADING`` (:class:`~redis.exceptions.BusyLoadingError`:
  it is reading its append-only file or snapshot) was not run; it is sent again.

**A call whose reply was lost** (the server died while running it or right after, a reply
timeout) may have run: replaying an ack as it was would report its items stale, a claim would
lease a second batch, a dead-letter put would be archived twice. So a backend says of each
script how it may be sent again (:class:`Scripts`):

* *replayed* (every script that changes state and is not naturally idempotent): each call
  carries a request id (a uuid4, the same on every resend of that call) as its last key,
  ``<base>:req:<id>`` in the backend's key space (for the frontier inside the source's hash
  tag). The script (:data:`REPLAY_LUA`, prepended to every script) first looks there: a reply
  recorded by an earlier run of the call is returned and nothing runs again; otherwise it runs
  and records its reply there for :data:`REPLAY_S` (``SET ... EX``: the records cannot pile up).
  Reply and effects are written by one script, so they are kept or lost together, also by an
  append-only file that loses its last second in a crash: the resend then runs the call anew.
  A reply given before any write (a no-op) is not recorded: running it again is running it once;
* *resent* (read-only scripts, and ones whose second run is a no-op that answers the same):
  sent again as they are;
* any other: sent once; a lost reply fails the call with one line, as before.

A replayed or resent call is sent again after a connection error or a reply timeout, with the
same backoff, while the server is away for up to ``reconnect_s`` after the failure. A replayed
one only while its record surely lives: its resends start within ``REPLAY_S - 2 * reconnect_s -
60`` s of its first send (a resend may still wait for ``LOADING`` about twice ``reconnect_s``),
so a ``COLLECTOR_REDIS_RECONNECT_S`` of 270 s or more replays nothing. A client not built by
:func:`connect` (a ready-made ``redis.Redis``) is used as it is: nothing is sent again. A
server that restarted *without* its data has no record either: the call runs anew there, and
the backends' own checks (the frontier's fencing token, the dead-letter store's epoch) say the
data is gone. A script the restarted server forgot (``NOSCRIPT``: scripts are not kept across
restarts) did not run; redis-py's :class:`~redis.commands.core.Script` loads it again.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import Script
from redis.exceptions import AuthenticationError, AuthorizationError, BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from collector.errors import BackendError
from collector.ops.scrub import REDACTED, is_secret_name

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HEALTH_CHECK_INTERVAL_S",
    "RECONNECT_S",
    "REPLAY_LUA",
    "REPLAY_S",
    "SOCKET_TIMEOUT_S",
    "Scripts",
    "backend_error",
    "backoff",
    "client_for",
    "connect",
    "describe_client",
    "describe_url",
    "lua_source",
    "one_line",
    "resending",
    "script_text",
]

_T = TypeVar("_T")

# A server that does not answer the TCP handshake in this time is down or unreachable.
CONNECT_TIMEOUT_S = 5.0
# Longest wait for one reply. A claim that expires a large backlog runs for seconds inside Redis;
# a reply that times out leaves the caller unsure whether the script ran, so be generous.
SOCKET_TIMEOUT_S = 60.0
# A pooled connection idle this long is PINGed before use, so a half-open one (a server that
# went away without a FIN, a NAT that dropped the flow) is noticed before a script is sent on it.
HEALTH_CHECK_INTERVAL_S = 30
# How long a call waits for a server that is down or loading (a restart) before it fails; the
# environment variable COLLECTOR_REDIS_RECONNECT_S overrides it (seconds, 0: fail at once).
RECONNECT_S = 30.0
# Waits between tries: full jitter below base * 2**n, at most the cap (redis-py's backoff).
_BACKOFF_BASE_S, _BACKOFF_CAP_S = 0.05, 2.0
# How long a replayed script's reply is kept for a resend of its call (seconds). Long enough for
# a restart and the wait for it; short enough that the records of a busy run stay small (a
# claim's record is its reply: ~100 bytes an item).
REPLAY_S = 600
# Prepended to every script (before the backend's prelude). A replayed script starts with
#   local again = replayed() if again ~= nil then return again end
# and returns remember(reply) wherever it returns after a write.
REPLAY_LUA = f"""\
-- A call of a replayed script carries a last KEY <base>:req:<request id>, the same on every
-- resend of the call (collector/_redis.py). replayed(): the reply an earlier run of the call
-- recorded there (nil: none ran). remember(reply): record it for {REPLAY_S} s, in this script's
-- write, so the record and the effects are kept or lost together. Returns reply.
local function replayed()
  local raw = redis.call('GET', KEYS[#KEYS])
  if raw then return cmsgpack.unpack(raw) end
  return nil
end
local function remember(reply)
  redis.call('SET', KEYS[#KEYS], cmsgpack.pack(reply), 'EX', {REPLAY_S})
  return reply
end
"""
# Lost connections and reply timeouts: a resend may help. (A refused login will not.)
_LOST = (RedisConnectionError, RedisTimeoutError)
_REFUSED = (AuthenticationError, AuthorizationError)


def backoff() -> ExponentialWithJitterBackoff:
    """The wait between tries of every Redis client of Collector (frontier, dead letters,
    breaker, limiter): full jitter below ``_BACKOFF_BASE_S * 2**n``, at most ``_BACKOFF_CAP_S``."""
    return ExponentialWithJitterBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S)


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
            netloc = f"{parts.username or ''}:{REDACTED}@{host}" + (
                f":{parts.port}" if parts.port else ""
            )
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(n, REDACTED if is_secret_name(n, in_url=True) else v) for n, v in pairs],
                safe="[]",
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


def reconnect_s() -> float:
    """:data:`RECONNECT_S`, or ``COLLECTOR_REDIS_RECONNECT_S`` when set (a bad value: an error)."""
    raw = os.environ.get("COLLECTOR_REDIS_RECONNECT_S", "").strip()
    if not raw:
        return RECONNECT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise BackendError(
            f"COLLECTOR_REDIS_RECONNECT_S={raw!r}: give the seconds to wait for Redis (>= 0)"
        )
    return value


@dataclass(slots=True)
class _Patience:
    """How long one client's connections wait for its server; shared by the pool's connections.

    Only once a connection has been made: a server never reached is a wrong URL or a server
    that is not running, said at once (the backends ping on open), not after the wait. A thread
    that resends a call may end its waits earlier (:meth:`until`): a replayed call's record
    must still be there when the resend arrives.
    """

    wait_s: float
    reached: bool = False
    _local: threading.local = field(default_factory=threading.local)

    def deadline(self) -> float:
        """Until when a connection made now may keep trying."""
        now = time.monotonic()
        if not self.reached:
            return now
        cap: float | None = getattr(self._local, "until", None)
        return now + self.wait_s if cap is None else min(now + self.wait_s, cap)

    def gave_up(self, now: bool | None = None) -> bool:
        """Whether this thread's last connection gave up waiting (set it with ``now``): the
        call failed *before* it was sent, after the whole wait."""
        if now is not None:
            self._local.gave_up = now
        return bool(getattr(self._local, "gave_up", False))

    @contextmanager
    def until(self, deadline: float) -> Iterator[None]:
        """This thread's connections try at most until ``deadline`` (monotonic)."""
        self._local.until = deadline
        try:
            yield
        finally:
            self._local.until = None


class _Reconnecting:
    """Mixed into a redis-py connection class: (re)connect until the client's wait has passed.

    See the module docstring for why only these steps are retried. ``self.retry`` (the client's
    :class:`Retry`, which redis-py also applies to whole commands) retries ``LOADING`` only.
    """

    def __init__(self, *args: Any, patience: _Patience, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.patience = patience

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self._sock:  # type: ignore[attr-defined]
            return
        patience = self.patience
        deadline = patience.deadline()
        parent = super()

        def until_deadline(error: Exception) -> None:
            self.disconnect()  # type: ignore[attr-defined]  # a half-made connection goes
            if time.monotonic() >= deadline:
                patience.gave_up(True)
                raise error

        Retry(
            backoff(),
            -1,  # bounded by the deadline, not a count
            (RedisConnectionError, RedisTimeoutError, OSError),
        ).call_with_retry(
            lambda: parent.connect_check_health(  # type: ignore[attr-defined]
                check_health=check_health, retry_socket_connect=False
            ),
            until_deadline,
        )
        patience.reached = True

    def check_health(self) -> None:
        try:
            super().check_health()  # type: ignore[misc]
        except (RedisConnectionError, RedisTimeoutError):
            # The PING before a command failed: the command was not sent. Connect again.
            self.disconnect()  # type: ignore[attr-defined]
            self.connect_check_health(check_health=False)


@functools.cache
def _reconnecting(base: type[Any]) -> type[Any]:
    """``base`` (TCP, TLS or unix-socket connection) with :class:`_Reconnecting` mixed in."""
    return type(f"Reconnecting{base.__name__}", (_Reconnecting, base), {})


def connect(url: str, *, what: str, reconnect: float | None = None) -> redis.Redis:
    """A client for ``url`` with Collector's settings; a malformed URL is a BackendError.

    ``what`` starts the error message (e.g. ``"frontier redis://host:6379/0"``). No connection is
    made here: the caller pings, so that it can say "cannot connect" in its own words (at once:
    the wait is for a server that went away). Once a connection was made, calls wait up to
    ``reconnect`` seconds (default :func:`reconnect_s`) for a server that is down.
    """
    wait_s = reconnect_s() if reconnect is None else reconnect
    loading = Retry(
        backoff(),
        _retries_within(wait_s),
        (BusyLoadingError,),  # refused, not run: safe for every command
    )
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            retry=loading,
        )
    except (ValueError, RedisError) as exc:
        raise backend_error(f"{what}: invalid Redis URL", exc) from exc
    pool = client.connection_pool
    pool.connection_class = _reconnecting(pool.connection_class)
    pool.connection_kwargs["patience"] = _Patience(wait_s)
    return client


def client_for(url_or_client: str | redis.Redis, *, what: str) -> tuple[redis.Redis, str, bool]:
    """A backend's client, where it points (password masked) and whether the backend owns it:
    one :func:`connect` made from a URL (the backend closes it), or a ready client (used as it
    is, never closed by the backend). ``what`` names the backend in messages."""
    if isinstance(url_or_client, str):
        url = describe_url(url_or_client)
        return connect(url_or_client, what=f"{what} {url}"), url, True
    return url_or_client, describe_client(url_or_client), False


def _retries_within(wait_s: float) -> int:
    """Tries of the backoff whose waits add up to about ``wait_s`` (each at most the cap)."""
    return 0 if wait_s <= 0 else max(1, int(wait_s / (_BACKOFF_CAP_S / 2)))


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


def script_text(package: str, prelude: str, name: str) -> str:
    """What :class:`Scripts` sends for ``package``'s script ``name`` (its SHA is the text's)."""
    return REPLAY_LUA + lua_source(package, prelude, name)


class Scripts:
    """A backend's Lua scripts, registered on one client; call them by name.

    Construction PINGs the server (a wrong URL fails there) and sends each script once (SCRIPT
    LOAD), so the first call is one EVALSHA; a server that restarted and forgot them gets them
    again transparently (redis-py's NOSCRIPT fallback).
    Each script is sent after :data:`REPLAY_LUA`. ``replayed`` names the scripts that record
    their reply under a request id, ``resent`` the ones that are safe to send again as they are;
    both are sent again when their reply was lost (see the module docstring), the others never.
    """

    def __init__(
        self,
        client: redis.Redis,
        package: str,
        names: Iterable[str],
        *,
        prelude: str = "prelude",
        replayed: Collection[str] = (),
        resent: Collection[str] = (),
    ) -> None:
        self._client = client
        self._scripts: dict[str, Script] = {}
        self._replayed = frozenset(replayed)
        self._resent = frozenset(resent)
        client.ping()
        for name in names:
            source = script_text(package, prelude, name)
            script = client.register_script(source)
            script.sha = client.script_load(source)
            self._scripts[name] = script
        odd = (self._replayed | self._resent) - self._scripts.keys()
        if odd or self._replayed & self._resent:
            raise ValueError(f"scripts {sorted(odd or self._replayed & self._resent)}: "
                             "each is replayed, resent or neither, and has a file")  # fmt: skip

    def __call__(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], *, records: str = ""
    ) -> Any:
        """Run script ``name``; a lost reply is handled as the script allows (class docstring).

        ``records`` is the key prefix of the reply records of a replayed script (``<base>:req:``,
        in the same hash tag as ``keys``); a request id is appended to it, the last key.
        """
        if name in self._replayed:
            if not records:
                raise ValueError(f"script {name!r} is replayed: give the prefix of its records")
            with_id = [*keys, records + uuid.uuid4().hex]  # one id for the call and its resends
            return resending(self._client, lambda: self.send(name, with_id, args), replayed=True)
        if name in self._resent:
            return resending(self._client, lambda: self.send(name, keys, args))
        return self.send(name, keys, args)

    def send(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One EVALSHA of script ``name`` with exactly these keys (a replayed script's last key
        is its record), sent once."""
        return self._scripts[name](keys=keys, args=args, client=self._client)


def _patience(client: redis.Redis) -> _Patience | None:
    found = client.connection_pool.connection_kwargs.get("patience")
    return found if isinstance(found, _Patience) else None


def resending(client: redis.Redis, call: Callable[[], _T], *, replayed: bool = False) -> _T:
    """``call()``, sent again after a lost connection or a reply timeout while the server is away.

    ``call`` must be safe to run twice: read-only, a second run that changes nothing and answers
    the same, or (``replayed``) a script that records its reply under a request id. Resends
    start for up to the client's ``reconnect_s`` after the failure, a replayed call's only while
    its record surely lives (module docstring); each resend's connection waits no longer. A
    client not built by :func:`connect`, or a server never reached: sent once.
    """
    patience = _patience(client)
    if patience is None:
        return call()
    first_sent = time.monotonic()
    patience.gave_up(False)
    try:
        return call()
    except _REFUSED:
        raise
    except _LOST as exc:
        if not patience.reached or patience.gave_up():
            raise  # never reached, or not sent after the whole wait: nothing to wait for again
        error: RedisError = exc
    until = time.monotonic() + patience.wait_s
    if replayed:
        until = min(until, first_sent + REPLAY_S - 2 * patience.wait_s - 60)
    waits = backoff()
    tries = 0
    with patience.until(until):
        while time.monotonic() < until:
            try:
                return call()
            except _REFUSED:
                raise
            except _LOST as exc:
                error = exc
            tries += 1
            time.sleep(max(0.0, min(waits.compute(tries), until - time.monotonic())))
    raise error
