"""Servers that break HTTP itself: every fault ends as a one-line, classified fetch failure.

A real TCP server on loopback answers each path with raw bytes (a garbage status line, a body
cut short, a connection closed before any answer, a header too long to parse, a keep-alive
connection the server drops between requests), on both connection pools under httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from collector.fetch.engine import FetchEngine
from collector.fetch.transport import TransportKind
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget, RetrySettings
from collector.policy.urls import HostPolicy

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{"id": 1}'

# path -> raw reply (None: close without a word); the connection is closed after each reply
# unless the path says keep-alive.
REPLIES: dict[str, bytes | None] = {
    "/garbage-status": b"HTCPCP/1.0 I'm a teapot\r\n\r\n",
    "/cut-body": b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"id": 1, "na',
    "/silent-close": None,
    "/huge-header": (
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}"
    ),
    "/ok": OK,
    "/set-cookie": (
        b'HTTP/1.1 200 OK\r\nSet-Cookie: session=abc; Path=/\r\nContent-Length: 9\r\n\r\n{"id": 1}'
    ),
    "/long-header": (  # a long CSP header, as real sites send: fine on both pools
        b"HTTP/1.1 200 OK\r\nContent-Security-Policy: " + b"c" * 12_000 + b"\r\n"
        b'Content-Length: 9\r\n\r\n{"id": 1}'
    ),
}


HEADS: list[bytes] = []  # request heads the raw server received, in order


@pytest.fixture
async def raw_server() -> AsyncIterator[str]:
    HEADS.clear()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                HEADS.append(head)
                path = head.split(b" ", 2)[1].decode()
                reply = REPLIES[path.split("?")[0]]
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if path != "/ok":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> TransportKind:
    kind: TransportKind = request.param
    return kind


def engine(transport: TransportKind) -> FetchEngine:
    return FetchEngine(
        retry=RetrySettings(base_s=0.01, cap_s=0.02, max_attempts=2, max_inline_delay_s=1),
        host_policy=HostPolicy(allow_private_networks=True),
        http_timeout_s=2.0,
        request_deadline_s=3.0,
        concurrency=2,
        per_domain_concurrency=2,
        transport=transport,
    )


@pytest.mark.parametrize("path", ["/garbage-status", "/cut-body", "/silent-close", "/huge-header"])
async def test_broken_http_is_a_recoverable_failure_with_one_line(
    raw_server: str, transport: TransportKind, path: str
) -> None:
    async with engine(transport) as e:
        (result,) = await e.fetch_batch(
            [ClaimedItem(raw_server + path, 0, None, 0.0)],
            budget=RetryBudget(ratio=1.0, min_retries=10),
        )
    assert result.status == "failed" and result.error is not None
    assert result.attempts == 2  # retried once inline, then given up: the server may recover
    assert result.error.error_class in {"network_error", "timeout"}, result.error
    assert result.decision is not None and result.decision.action == "dead"
    assert "\n" not in str(result.error) and len(str(result.error)) < 300


async def test_ok_pages_around_broken_ones_are_fetched(
    raw_server: str, transport: TransportKind
) -> None:
    urls = [f"{raw_server}/ok?{i}" for i in range(6)] + [raw_server + "/cut-body"]
    async with engine(transport) as e:
        results = await e.fetch_batch(
            [ClaimedItem(url, 0, None, 0.0) for url in urls],
            budget=RetryBudget(ratio=1.0, min_retries=10),
        )
    assert [r.status for r in results] == ["ok"] * 6 + ["failed"]
    assert all(r.body == b'{"id": 1}' for r in results[:6])


async def test_a_long_but_reasonable_header_is_accepted(
    raw_server: str, transport: TransportKind
) -> None:
    async with engine(transport) as e:
        (result,) = await e.fetch_batch(
            [ClaimedItem(raw_server + "/long-header", 0, None, 0.0)],
            budget=RetryBudget(ratio=1.0, min_retries=10),
        )
    assert result.status == "ok" and result.body == b'{"id": 1}', result.error


async def test_a_cookie_a_response_sets_is_sent_back(
    raw_server: str, transport: TransportKind
) -> None:
    """The engine skips cookie bookkeeping for responses without Set-Cookie, not the cookies."""
    async with engine(transport) as e:
        budget = RetryBudget(ratio=1.0, min_retries=10)
        for path in ("/ok?before", "/set-cookie", "/ok?after"):
            (result,) = await e.fetch_batch(
                [ClaimedItem(raw_server + path, 0, None, 0.0)], budget=budget
            )
            assert result.status == "ok", result.error
    before, _, after = HEADS
    assert b"cookie:" not in before.lower()
    assert b"cookie: session=abc" in after.lower()
