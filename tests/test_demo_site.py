"""The demo fault site, exercised over real HTTP on a free local port (no mocks)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collector.demo.site import FaultSite, RequestRecord, record
from tests.helpers import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def site() -> Iterator[FaultSite]:
    with FaultSite() as s:
        yield s


@pytest.fixture
def client(site: FaultSite) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=site.base_url, timeout=10) as c:
        yield c


# -- routes ---------------------------------------------------------------------------------------


def test_item_record(client: httpx.Client) -> None:
    r = client.get("/items/5.json")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.json() == {
        "id": 5,
        "name": "item 5",
        "price": 19.5,
        "category": "tools",
        "updated": "2026-01-01T00:00:00Z",
    }


@pytest.mark.parametrize("i", [0, 1, 2, 3, 27, 999, 123456])
def test_item_records_are_deterministic(client: httpx.Client, i: int) -> None:
    expected = {
        "id": i,
        "name": f"item {i}",
        "price": round(1 + (i * 37 % 1000) / 10, 2),
        "category": ["books", "tools", "games", "food"][i % 4],
        "updated": "2026-01-01T00:00:00Z",
    }
    assert record(i) == expected
    assert client.get(f"/items/{i}.json").json() == expected


def test_listing_defaults_and_paging(client: httpx.Client) -> None:
    assert client.get("/items").json() == {"items": [record(i) for i in range(10)]}
    page = client.get("/items", params={"start": 40, "count": 3})
    assert page.status_code == 200
    assert page.json() == {"items": [record(40), record(41), record(42)]}
    assert client.get("/items?count=0").json() == {"items": []}


def test_listing_count_is_capped(client: httpx.Client) -> None:
    items = client.get("/items?start=5&count=5000").json()["items"]
    assert len(items) == 1000
    assert items[0]["id"] == 5 and items[-1]["id"] == 1004


def test_head_is_get_without_body(client: httpx.Client) -> None:
    get = client.get("/items/3.json")
    head = client.head("/items/3.json")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"]
    big = client.head("/items/3.json?bytes=10000000")
    assert big.headers["content-length"] == "10000000"
    assert big.content == b""


@pytest.mark.parametrize("path", ["/missing/1.json", "/missing", "/nope", "/items/x.json", "/"])
def test_unknown_paths_are_404(client: httpx.Client, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert r.json() == {"error": "not found"}


def test_other_methods_are_405(client: httpx.Client) -> None:
    r = client.post("/items/1.json", content=b"x" * 1000)
    assert r.status_code == 405
    assert client.get("/items/1.json").status_code == 200  # connection still usable


@pytest.mark.parametrize(
    "query", ["status=abc", "status=99", "status=700", "times=x&status=500", "delay=soon"]
)
def test_bad_knob_values_are_400(client: httpx.Client, query: str) -> None:
    r = client.get(f"/items/1.json?{query}")
    assert r.status_code == 400
    assert "error" in r.json()


# -- fault knobs ----------------------------------------------------------------------------------


def test_status_times(client: httpx.Client) -> None:
    url = "/items/5.json?status=503&times=2"
    first, second, third, fourth = (client.get(url) for _ in range(4))
    assert [first.status_code, second.status_code] == [503, 503]
    assert first.json()["status"] == 503
    assert "retry-after" not in first.headers
    assert (third.status_code, fourth.status_code) == (200, 200)
    assert third.json() == record(5)


def test_status_default_times_is_one(client: httpx.Client) -> None:
    codes = [client.get("/items/8.json?status=500").status_code for _ in range(3)]
    assert codes == [500, 200, 200]


def test_status_times_minus_one_is_always(client: httpx.Client) -> None:
    codes = [client.get("/items/8.json?status=429&times=-1").status_code for _ in range(5)]
    assert codes == [429] * 5


def test_status_with_retry_after(client: httpx.Client) -> None:
    url = "/items/2.json?status=429&times=1&retry_after=3"
    faulted = client.get(url)
    assert faulted.status_code == 429
    assert faulted.headers["retry-after"] == "3"
    after = client.get(url)
    assert after.status_code == 200
    assert "retry-after" not in after.headers
    assert client.get("/items/2.json?status=503&retry_after=0.5").headers["retry-after"] == "0.5"


def test_each_url_has_its_own_fault_history(client: httpx.Client) -> None:
    a = "/items/1.json?status=503"
    b = "/items/1.json?status=503&attempt=2"
    assert client.get(a).status_code == 503
    assert client.get(a).status_code == 200
    assert client.get(b).status_code == 503  # a different query string: a fresh counter
    assert client.get("/items/2.json?status=503").status_code == 503


def test_delay_every_time(client: httpx.Client) -> None:
    for _ in range(2):
        t0 = time.perf_counter()
        assert client.get("/items/1.json?delay=0.2").status_code == 200
        assert time.perf_counter() - t0 >= 0.2


def test_delay_only_while_times_applies(client: httpx.Client) -> None:
    """The first request waits 30 s (the client gives up after 1 s), the second is not held:
    answered well inside 20 s. Bounds far apart, so a loaded box cannot blur them."""
    url = "/items/1.json?delay=30&times=1"
    with pytest.raises(httpx.ReadTimeout):
        client.get(url, timeout=1)
    assert client.get(url, timeout=20).status_code == 200


def test_delay_exceeding_client_timeout(site: FaultSite) -> None:
    with httpx.Client(timeout=0.1) as c, pytest.raises(httpx.ReadTimeout):
        c.get(site.url("/items/1.json?delay=30"))  # 30 s: a starved client gives up first
    with httpx.Client(timeout=5) as c:
        assert c.get(site.url("/items/1.json")).status_code == 200


def test_malformed(client: httpx.Client) -> None:
    r = client.get("/items/5.json?malformed=1")
    assert r.status_code == 200
    assert r.text == '{"id": 5, "name": "item 5", "pri'
    assert int(r.headers["content-length"]) == len(r.content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


def test_malformed_with_times(client: httpx.Client) -> None:
    url = "/items/6.json?malformed=1&times=1"
    with pytest.raises(json.JSONDecodeError):
        client.get(url).json()
    assert client.get(url).json() == record(6)


def test_invalid(client: httpx.Client) -> None:
    body = client.get("/items/5.json?invalid=1").json()
    assert body["id"] == 5
    assert body["price"] == -1
    assert body["name"] is None
    assert body["category"] == "tools"


def test_bytes_small(client: httpx.Client) -> None:
    r = client.get("/items/4.json?bytes=5000")
    assert len(r.content) == 5000
    body = r.json()
    assert {k: v for k, v in body.items() if k != "blob"} == record(4)
    assert set(body["blob"]) == {"x"}


def test_bytes_smaller_than_record_is_still_valid(client: httpx.Client) -> None:
    body = client.get("/items/4.json?bytes=10").json()
    assert body["blob"] == ""
    assert body["id"] == 4


def test_bytes_large_is_streamed(client: httpx.Client) -> None:
    size = 50_000_000
    received = 0
    head = b""
    tail = b""
    with client.stream("GET", f"/items/9.json?bytes={size}") as r:
        assert r.status_code == 200
        assert int(r.headers["content-length"]) == size
        for chunk in r.iter_raw(1 << 20):
            if len(head) < 64:
                head += chunk[:64]
            received += len(chunk)
            tail = (tail + chunk)[-16:]
    assert received == size
    assert head.startswith(b'{"id": 9, "name": "item 9"')
    assert tail.endswith(b'xxx"}')


def test_client_disconnect_mid_stream_is_quiet(
    site: FaultSite, client: httpx.Client, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(3):
        with client.stream("GET", "/items/1.json?bytes=500000000") as r:
            next(r.iter_raw(65536))
        # leaving the block closes the half-read connection
    time.sleep(0.3)  # let the server threads hit the broken pipe
    assert client.get("/items/1.json").status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Broken" not in err and "reset" not in err.lower()
    assert site.request_count("/items/1.json?bytes=") == 3


def test_redirect(client: httpx.Client) -> None:
    r = client.get("/items/5.json?redirect=%2Fitems%2F7.json")
    assert r.status_code == 302
    assert r.headers["location"] == "/items/7.json"
    followed = client.get(
        "/items/5.json", params={"redirect": "/items/7.json"}, follow_redirects=True
    )
    assert followed.status_code == 200
    assert followed.json() == record(7)
    assert followed.history[0].status_code == 302


def test_knobs_on_listing(client: httpx.Client) -> None:
    assert client.get("/items?start=3&count=2&status=503").status_code == 503
    assert client.get("/items?start=3&count=2&status=503").json()["items"][0] == record(3)


# -- request log ----------------------------------------------------------------------------------


def test_request_log_stats_and_reset(site: FaultSite, client: httpx.Client) -> None:
    client.get("/items/1.json")
    client.get("/items/2.json?status=503")
    client.head("/items/3.json")
    client.get("/missing/x")
    stats = client.get("/__stats")
    assert stats.json() == {"requests": 4}

    log = site.requests
    assert [(r.method, r.path, r.status) for r in log] == [
        ("GET", "/items/1.json", 200),
        ("GET", "/items/2.json?status=503", 503),
        ("HEAD", "/items/3.json", 200),
        ("GET", "/missing/x", 404),
    ]
    assert all(isinstance(r, RequestRecord) for r in log)
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", r.peer) for r in log)
    assert all(abs(r.at - time.time()) < 60 for r in log)
    assert log[0].at <= log[-1].at

    log.clear()  # a copy: the site's log is untouched
    assert len(site.requests) == 4
    assert site.request_count() == 4
    assert site.request_count("/items/") == 3
    assert site.request_count("/items/2.json") == 1
    assert site.request_count("/nothing") == 0

    site.reset()
    assert site.requests == []
    assert client.get("/__stats").json() == {"requests": 0}
    # fault counters were reset too: the one-shot fault fires again
    assert client.get("/items/2.json?status=503").status_code == 503


def test_request_record_is_frozen() -> None:
    rec = RequestRecord("GET", "/items/1.json", 200, 0.0, "127.0.0.1:1")
    with pytest.raises(AttributeError):
        rec.status = 500  # type: ignore[misc]  # frozen: the test


# -- concurrency, lifecycle ----------------------------------------------------------------------


def test_200_concurrent_async_requests(site: FaultSite) -> None:
    """200 requests at once over 32 pooled connections: all answered, and the site keeps each
    connection alive, so no more than 32 client ports are seen.

    Neither bound is a speed: a queued request waits for a connection as long as it takes
    (``pool=None``; a loaded box ran the 200 in over 10 s), and a pooled connection never
    expires (httpx's default 5 s idle expiry reopened connections, 34-48 ports, when the loop
    was starved between a connection's assignment and its request)."""

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(
            max_connections=32, max_keepalive_connections=32, keepalive_expiry=None
        )
        timeout = httpx.Timeout(60, pool=None)  # 60 s: a hang guard for one exchange
        async with httpx.AsyncClient(base_url=site.base_url, limits=limits, timeout=timeout) as c:
            return await asyncio.gather(*(c.get(f"/items/{i}.json") for i in range(200)))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 200
    assert [r.json()["id"] for r in responses] == list(range(200))
    assert site.request_count("/items/") == 200
    peers = sorted({r.peer for r in site.requests})
    assert len(peers) <= 32, f"{len(peers)} client connections for 200 requests: {peers}"


def test_concurrent_requests_to_one_faulty_url_share_its_counter(site: FaultSite) -> None:
    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=site.base_url, timeout=10) as c:
            responses = await asyncio.gather(
                *(c.get("/items/1.json?status=503&times=10") for _ in range(50))
            )
            return [r.status_code for r in responses]

    codes = asyncio.run(run())
    assert codes.count(503) == 10
    assert codes.count(200) == 40


def test_two_sites_side_by_side() -> None:
    with FaultSite() as a, FaultSite() as b:
        assert a.base_url != b.base_url
        with httpx.Client(timeout=5) as c:
            assert c.get(a.url("/items/1.json?status=503")).status_code == 503
            assert c.get(b.url("/items/1.json?status=503")).status_code == 503
            c.get(b.url("/items/2.json"))
        assert a.request_count() == 1
        assert b.request_count() == 2


def test_lifecycle() -> None:
    site = FaultSite()
    with pytest.raises(RuntimeError):
        _ = site.base_url
    assert site.start() is site
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", site.base_url)
    assert site.url("/items/1.json") == site.base_url + "/items/1.json"
    with pytest.raises(RuntimeError):
        site.start()
    with httpx.Client(timeout=2) as c:
        assert c.get(site.url("/items/1.json")).status_code == 200
        url = site.url("/items/1.json")
        site.stop()
        site.stop()  # idempotent
        # the kept-alive connection was closed too, so nothing answers any more
        with pytest.raises(httpx.TransportError):
            c.get(url)
    site.start()  # restartable; the log survives
    try:
        assert site.request_count() == 1
    finally:
        site.stop()


def test_explicit_port() -> None:
    with FaultSite() as probe:
        port = int(probe.base_url.rsplit(":", 1)[1])
    with FaultSite(port=port) as s:
        assert s.base_url == f"http://127.0.0.1:{port}"
        assert httpx.get(s.url("/items/1.json")).status_code == 200


def test_cli_serves_until_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.demo.site", "--port", "0"],
        cwd=ROOT,
        preexec_fn=as_from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base_url)
        assert httpx.get(base_url + "/items/3.json", timeout=5).json() == record(3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0  # a guard against a hang (10 s was short at load 20)
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
