"""``${secret:NAME}`` and ``block: NAME`` against a real Prefect API: the blocks are created
through the API first, then a run's backends are opened from them."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from prefect.blocks.system import Secret
from prefect_redis import RedisDatabase

from collector.backends import open_deadletters, open_frontier, open_sink
from collector.config import load_source
from collector.errors import ConfigError
from collector.frontier import Offer
from collector.ops.secrets import known_secret, redis_url_from_block
from tests.servers import PostgresServer
from tests.test_config import minimal, write

pytestmark = pytest.mark.usefixtures("prefect_api")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_dsn_password_from_a_secret_block(
    tmp_path: Path, postgres_dsn: str, postgres_server: PostgresServer
) -> None:
    block = _name("pg-password")
    Secret(value="pg-secret-pw-1").save(block)
    dsn = postgres_dsn.replace("postgres@", f"postgres:${{secret:{block}}}@", 1)
    source = load_source(write(tmp_path, minimal(sink={"type": "postgres", "dsn": dsn})))
    assert source.secret_values() == []  # nothing loaded yet: nothing to scrub yet
    sink = open_sink(source)
    try:
        sink.write([], token=1, batch_id="b")
        assert sink.count() == 0
        assert "pg-secret-pw-1" not in sink.location()
        assert sink.location().startswith(f"postgresql://postgres@127.0.0.1:{postgres_server.port}")
    finally:
        sink.close()
    assert source.secret_values() == ["pg-secret-pw-1"]  # loaded, so scrubbed from now on


def test_a_whole_dsn_from_a_secret_block(tmp_path: Path, postgres_dsn: str) -> None:
    block = _name("pg-dsn")
    Secret(value=postgres_dsn).save(block)
    sink_settings = {"type": "postgres", "dsn": f"${{secret:{block}}}", "table": "from_secret"}
    source = load_source(write(tmp_path, minimal(sink=sink_settings)))
    sink = open_sink(source)
    try:
        assert sink.location().endswith("table from_secret")
    finally:
        sink.close()


def test_a_missing_secret_block_is_one_line_naming_the_field(tmp_path: Path) -> None:
    sink_settings = {"type": "postgres", "dsn": "postgresql://a:${secret:absent-block}@h/db"}
    source = load_source(write(tmp_path, minimal(sink=sink_settings)))
    with pytest.raises(ConfigError) as caught:
        open_sink(source)
    assert str(caught.value) == "sink.dsn: Prefect Secret block 'absent-block' not found"


def test_a_secret_block_that_is_not_a_string(tmp_path: Path) -> None:
    block = _name("pg-dict")
    Secret(value={"user": "u"}).save(block)
    sink_settings = {"type": "postgres", "dsn": f"${{secret:{block}}}"}
    source = load_source(write(tmp_path, minimal(sink=sink_settings)))
    with pytest.raises(ConfigError, match=f"sink.dsn: Prefect Secret block '{block}' holds a dict"):
        open_sink(source)


def test_redis_backends_from_a_redis_database_block(tmp_path: Path, redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    block = _name("redis")
    RedisDatabase(host="127.0.0.1", port=port, db=0).save(block)
    source = load_source(
        write(
            tmp_path,
            minimal(
                frontier={"type": "redis", "block": block},
                deadletters={"type": "redis", "block": block},
            ),
        )
    )
    frontier = open_frontier(source)
    by_url = open_frontier(
        load_source(
            write(tmp_path, minimal(frontier={"type": "redis", "url": redis_url}), "u.yaml")
        )
    )
    try:
        frontier.offer(
            "items",
            [Offer("https://example.com/a", 60.0)],
            now=1.0,
            queue_ttl_s=60,
            rank_for=lambda url, age_s, fresh_s: 1.0,
            run_id="r1",
        )
        assert by_url.counts("items").queued == 1  # the block pointed at the same server
    finally:
        frontier.close()
        by_url.close()
    letters = open_deadletters(source)
    try:
        assert f"127.0.0.1:{port}" in letters.location()
    finally:
        letters.close()


def test_a_redis_database_block_with_credentials_becomes_a_url() -> None:
    block = _name("redis-auth")
    RedisDatabase(
        host="cache.internal", port=6380, db=3, username="app", password="p@ss/w", ssl=True
    ).save(block)
    url = redis_url_from_block(block, field="frontier.block")
    assert url == "rediss://app:p%40ss%2Fw@cache.internal:6380/3"
    assert known_secret("redis", block) == "p@ss/w"
    plain = _name("redis-plain")
    RedisDatabase(host="h", port=7000).save(plain)
    assert redis_url_from_block(plain, field="frontier.block") == "redis://h:7000/0"


def test_a_missing_redis_block_is_one_line_naming_the_field(tmp_path: Path) -> None:
    source = load_source(write(tmp_path, minimal(deadletters={"type": "redis", "block": "nope"})))
    with pytest.raises(ConfigError) as caught:
        open_deadletters(source)
    assert str(caught.value) == "deadletters.block: Prefect RedisDatabase block 'nope' not found"


def test_collector_run_with_a_missing_secret_exits_2_with_one_line(
    tmp_path: Path, prefect_api: str
) -> None:
    import os

    sink_settings = {"type": "postgres", "dsn": "${secret:not-there}"}
    path = write(tmp_path, minimal(sink=sink_settings))
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(path)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PREFECT_API_URL": prefect_api},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"{path}: sink.dsn: Prefect Secret block 'not-there' not found"
    ]
