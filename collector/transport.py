"""Which connection pool carries the fetch engine's httpx requests.

The engine speaks httpx everywhere (redirects, the per-hop host check, timeouts, decoding, the
streamed size cap), but the bytes can travel through one of two pools:

* ``aiohttp`` (default): httpx's API on aiohttp's HTTP/1.1 pool through the well-kept
  ``httpx-aiohttp`` transport. aiohttp parses responses in C and scales with connections, so
  one client carries every connection; on a 2-core box against nginx on loopback a plain loop
  does ~3,000-3,600 pages/s on it against ~2,000 on httpx's own pool (bench/throughput.py).
* ``httpx``: httpx's own pool (httpcore). It slows down when one client holds many
  connections, so the engine keeps several small clients and lends one per request.

Whatever the pool, errors reach the engine as httpx exceptions; :func:`transport_error_class`
names the cause more precisely than httpx-aiohttp's mapping does (it reports a dropped
keep-alive connection as ``ConnectTimeout``, for instance).
"""

from __future__ import annotations

import math
import ssl
from typing import Literal

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from collector import defaults

__all__ = ["POOL_ERROR", "TransportKind", "make_clients", "transport_error_class"]

# What the aiohttp pool raises as it is (httpx-aiohttp maps only some of aiohttp's errors).
POOL_ERROR = aiohttp.ClientError

TransportKind = Literal["aiohttp", "httpx"]

_MESSAGE_CHARS = 200  # longest error message kept from the pool
# httpx's default keep-alive expiry, used for both pools.
KEEPALIVE_EXPIRY_S = 5.0


def make_clients(
    kind: TransportKind,
    *,
    connections: int,
    tls: ssl.SSLContext,
    **client_options: object,
) -> list[httpx.AsyncClient]:
    """Clients that together hold at most ``connections`` connections.

    Lend them round-robin (``clients[i % len(clients)]`` for ``i < connections``) to respect
    each one's pool. ``client_options`` go to every ``httpx.AsyncClient`` (timeout, headers,
    redirects, hooks). Create and close them inside the running event loop.
    """
    if kind == "aiohttp":
        return [
            httpx.AsyncClient(
                transport=_aiohttp_transport(connections, tls),
                trust_env=False,
                **client_options,  # type: ignore[arg-type]
            )
        ]
    per_client = min(defaults.CONNECTIONS_PER_CLIENT, connections)
    limits = httpx.Limits(
        max_connections=per_client,
        max_keepalive_connections=per_client,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    return [
        httpx.AsyncClient(verify=tls, limits=limits, trust_env=False, **client_options)  # type: ignore[arg-type]
        for _ in range(math.ceil(connections / per_client))
    ]


def _aiohttp_transport(connections: int, tls: ssl.SSLContext) -> httpx.AsyncBaseTransport:
    def session() -> aiohttp.ClientSession:
        # Called by the transport on its first request, so inside the running loop.
        connector = aiohttp.TCPConnector(
            limit=connections, limit_per_host=0, ssl=tls, keepalive_timeout=KEEPALIVE_EXPIRY_S
        )
        # httpx keeps cookies and sets the headers; aiohttp must not add a second cookie jar or
        # read proxies from the environment behind the source's back.
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
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


def transport_error_class(exc: BaseException) -> tuple[str, str] | None:
    """``(error_class, message)`` for an error raised inside the aiohttp pool, else None.

    httpx-aiohttp re-raises aiohttp's errors as httpx ones, keeping the original as
    ``__cause__``; unmapped ones (a malformed status line, oversized headers) arrive as they
    are. All of them are recoverable: the server or the network may behave next time.
    """
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if not isinstance(cause, aiohttp.ClientError):
        return None
    # aiohttp's messages can span lines and quote what the server sent: one short line.
    text = cause.message if isinstance(cause, aiohttp.ClientResponseError) else str(cause)
    text = " ".join(text.split())
    if len(text) > _MESSAGE_CHARS:
        text = text[: _MESSAGE_CHARS - 3] + "..."
    what = type(cause).__name__
    if isinstance(cause, aiohttp.ServerTimeoutError | aiohttp.SocketTimeoutError):
        return "timeout", f"timed out ({what}): {text}"
    if isinstance(cause, aiohttp.ClientConnectorError):
        return "connect_error", f"cannot connect: {text}"
    if isinstance(cause, aiohttp.ClientResponseError):
        return "network_error", f"malformed response ({what}): {text}"
    return "network_error", f"{what}: {text}"
