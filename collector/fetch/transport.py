"""Which connection pool carries the fetch engine's httpx requests.

The engine speaks httpx everywhere (redirects, the per-hop host check, timeouts, the streamed
size cap; it decodes the raw body itself, within the cap: collector.fetch.decoding), but the
bytes can travel through one of two pools:

* ``aiohttp`` (default): httpx's API on aiohttp's HTTP/1.1 pool through the well-kept
  ``httpx-aiohttp`` transport. aiohttp parses responses in C and scales with connections, so
  one client carries every connection; on a 2-core box against nginx on loopback a plain loop
  does ~3,000-3,600 pages/s on it against ~2,000 on httpx's own pool (bench/throughput.py).
* ``httpx``: httpx's own pool (httpcore). It slows down when one client holds many
  connections, so the engine keeps several small clients and lends one per request.

Whatever the pool, errors reach the engine as httpx exceptions; :func:`pool_failure` names the
cause more precisely than httpx-aiohttp's mapping does (it reports a dropped keep-alive
connection as ``ConnectTimeout``, for instance).

On aiohttp's pool the source's host policy is also applied when a connection is made: every
address a name resolves to is checked then (:class:`_CheckedResolver`), so a name that passed
the URL check and then re-resolves to a private address (DNS rebinding) is refused.
"""

from __future__ import annotations

import math
import os
import socket
import ssl
from typing import Literal

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from httpx_aiohttp import AiohttpTransport

from collector import defaults
from collector.errors import FetchError, PermanentFetchError, RecoverableFetchError
from collector.policy.urls import HostPolicy

__all__ = [
    "POOL_ERROR",
    "RefusedAddress",
    "TransportKind",
    "connect_failure",
    "make_clients",
    "pool_failure",
]

# What the aiohttp pool raises as it is (httpx-aiohttp maps only some of aiohttp's errors).
POOL_ERROR = aiohttp.ClientError

TransportKind = Literal["aiohttp", "httpx"]

_AIOHTTP_TIMEOUTS = (aiohttp.ServerTimeoutError, aiohttp.SocketTimeoutError)
_MESSAGE_CHARS = 200  # longest error message kept from the pool
H11_HEADER_BYTES = 16 * 1024  # h11's default max_incomplete_event_size
# httpx's default keep-alive expiry, used for both pools.
KEEPALIVE_EXPIRY_S = 5.0


def make_clients(
    kind: TransportKind,
    *,
    connections: int,
    tls: ssl.SSLContext,
    host_policy: HostPolicy | None = None,
    **client_options: object,
) -> list[httpx.AsyncClient]:
    """Clients that together hold at most ``connections`` connections.

    Lend them round-robin (``clients[i % len(clients)]`` for ``i < connections``) to respect
    each one's pool. ``client_options`` go to every ``httpx.AsyncClient`` (timeout, headers,
    redirects, hooks). Create and close them inside the running event loop. With
    ``host_policy``, aiohttp's pool checks each resolved address before it connects.
    """
    if kind == "aiohttp":
        clients = [
            httpx.AsyncClient(
                transport=_aiohttp_transport(connections, tls, host_policy),
                trust_env=False,
                **client_options,  # type: ignore[arg-type]
            )
        ]
    else:
        per_client = min(defaults.CONNECTIONS_PER_CLIENT, connections)
        limits = httpx.Limits(
            max_connections=per_client,
            max_keepalive_connections=per_client,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        clients = [
            httpx.AsyncClient(verify=tls, limits=limits, trust_env=False, **client_options)  # type: ignore[arg-type]
            for _ in range(math.ceil(connections / per_client))
        ]
    for client in clients:
        # httpx 0.28 keeps the store in ``_cookies`` (pinned in pyproject.toml; tested).
        client._cookies = _CookiesWhenSet(client.cookies)
    return clients


def _aiohttp_transport(
    connections: int, tls: ssl.SSLContext, host_policy: HostPolicy | None
) -> httpx.AsyncBaseTransport:
    def session() -> aiohttp.ClientSession:
        # Called by the transport on its first request, so inside the running loop.
        checked = host_policy is not None and not host_policy.allow_private_networks
        connector = aiohttp.TCPConnector(
            limit=connections,
            limit_per_host=0,
            ssl=tls,
            keepalive_timeout=KEEPALIVE_EXPIRY_S,
            resolver=_CheckedResolver(host_policy) if checked else None,  # type: ignore[arg-type]
        )
        # httpx keeps cookies and sets the headers; aiohttp must not add a second cookie jar or
        # read proxies from the environment behind the source's back.
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            # aiohttp refuses any header line over 8 KiB; h11 (httpx's own pool) takes a 16 KiB
            # header block. Real sites send long CSP and cookie headers: allow as much as h11.
            max_line_size=H11_HEADER_BYTES,
            max_field_size=H11_HEADER_BYTES,
        )

    return _ReadBodyFirst(client=session)


class _ReadBodyFirst(AiohttpTransport):
    """httpx-aiohttp's transport, with request bodies read before they are handed to aiohttp.

    httpx passes a redirected request's (empty) body on as an unread stream; httpx-aiohttp then
    lets aiohttp send it chunked, so a GET after a redirect carries an empty chunked body
    (``0`` CRLF CRLF), which a strict server reads as the next request line (400, and the
    keep-alive connection is lost). The engine only sends bodies it holds in memory, so
    reading them first costs nothing.
    """

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return await super().handle_async_request(request)


class _CookiesWhenSet(httpx.Cookies):
    """httpx's cookie store, skipping the extraction when a response sets no cookie.

    httpx wraps every response and its request in urllib look-alikes for the stdlib cookie jar
    even when there is no ``Set-Cookie`` header: ~10 % of the fetch loop's CPU on small pages
    (py-spy). Without the header the jar would not change (the default policy ignores the
    obsolete ``Set-Cookie2``), so skipping it changes nothing else.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:
            super().extract_cookies(response)


class RefusedAddress(OSError):
    """A name resolved, when connecting, to an address the source may not reach."""


class _CheckedResolver(AbstractResolver):
    """aiohttp's resolver, with every address it returns checked against the host policy.

    The whole name is refused when any address is refused, as the URL check does, so which
    address aiohttp would have tried first does not matter.
    """

    def __init__(self, policy: HostPolicy) -> None:
        self._inner = DefaultResolver()
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = self._policy.address_refusal(host, result["host"])
            if reason is not None:
                raise RefusedAddress(reason)
        return results

    async def close(self) -> None:
        await self._inner.close()


def pool_failure(exc: BaseException) -> FetchError | None:
    """The fetch error an exception from inside the aiohttp pool stands for, else None.

    httpx-aiohttp re-raises aiohttp's errors as httpx ones, keeping the original as
    ``__cause__``; unmapped ones (a malformed status line, oversized headers) arrive as they
    are. Real timeouts are left to the caller's httpx handling (mapped right, unlike a dropped
    connection, which arrives as ``ConnectTimeout``). An address refused when connecting is
    permanent; everything else is recoverable (the server or the network may behave again).
    """
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if not isinstance(cause, aiohttp.ClientError) or isinstance(cause, _AIOHTTP_TIMEOUTS):
        return None  # not from the pool, or a real timeout (httpx-aiohttp maps those right)
    refused = getattr(cause, "os_error", None)
    if isinstance(refused, RefusedAddress):
        return PermanentFetchError(str(refused), error_class="refused_url")
    # aiohttp's messages can span lines and quote what the server sent: one short line.
    text = cause.message if isinstance(cause, aiohttp.ClientResponseError) else str(cause)
    text = " ".join(text.split())
    if len(text) > _MESSAGE_CHARS:
        text = text[: _MESSAGE_CHARS - 3] + "..."
    what = type(cause).__name__
    if isinstance(cause, aiohttp.ClientConnectorError):
        # Its own text names aiohttp's connection key ("ssl:default" even for plain http):
        # say where and what happened instead, as httpx's own pool does (connect_failure).
        reason = (
            cause.certificate_error
            if isinstance(cause, aiohttp.ClientConnectorCertificateError)
            else cause.os_error
        )
        return _cannot_connect(cause.host, cause.port, reason)
    if isinstance(cause, aiohttp.ClientResponseError):
        return RecoverableFetchError(
            f"malformed response ({what}): {text}", error_class="network_error"
        )
    return RecoverableFetchError(f"{what}: {text}", error_class="network_error")


def connect_failure(exc: httpx.ConnectError) -> FetchError:
    """httpx's own pool failing to connect, as one line naming ``host:port`` and what happened.

    httpx says only "All connection attempts failed"; the operating system's reason (refused,
    unreachable, a name that does not resolve, a TLS handshake) is further down the chain.
    """
    try:
        url = exc.request.url
        host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
    except RuntimeError:  # no request attached: nothing to name
        host, port = "", None
    return _cannot_connect(host, port, _deepest_os_error(exc))


def _deepest_os_error(exc: BaseException) -> BaseException | None:
    """The innermost ``OSError`` under ``exc`` (the one with the system's reason), if any."""
    found: BaseException | None = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            found = current
        current = current.__cause__ or current.__context__
    return found


def _cannot_connect(host: str, port: int | None, error: BaseException | None) -> FetchError:
    """``cannot connect to host:port: what happened`` (recoverable: the server may come up)."""
    where = f"[{host}]" if ":" in host else host
    place = f" to {where}:{port}" if host and port else f" to {where}" if host else ""
    text = " ".join(_connect_reason(error).split())
    if len(text) > _MESSAGE_CHARS:
        text = text[: _MESSAGE_CHARS - 3] + "..."
    return RecoverableFetchError(f"cannot connect{place}: {text}", error_class="connect_error")


def _connect_reason(error: BaseException | None) -> str:
    """What the operating system (or the TLS layer) said, in words, without Python's repr."""
    if error is None:
        return "the connection failed"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted ({error.verify_message or error.reason})"
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed ({error.reason or error})"
    if isinstance(error, socket.gaierror):
        return f"the name does not resolve ({error.strerror or error})"
    if isinstance(error, TimeoutError):
        return "timed out"
    errno = getattr(error, "errno", None)
    if isinstance(errno, int) and errno > 0:
        said = os.strerror(errno)
        return said[:1].lower() + said[1:]  # "connection refused", "network is unreachable"
    return str(error) or type(error).__name__
