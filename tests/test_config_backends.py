"""Backend settings in a source file: the Postgres sink, Redis by block or URL, and the
``${env:}`` / ``${secret:}`` references. Nothing here reaches a server: loading and validating a
source never does."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import PostgresSinkSettings, load_source, source_json_schema
from collector.errors import ConfigError
from flows.cli import main
from tests.test_config import minimal, problems_of, the_problem, write

DSN = "postgresql://app@db.internal:5432/warehouse"


def test_postgres_sink_with_defaults(tmp_path: Path) -> None:
    source = load_source(write(tmp_path, minimal(sink={"type": "postgres", "dsn": DSN})))
    assert isinstance(source.sink, PostgresSinkSettings)
    assert (source.sink.dsn, source.sink.table) == (DSN, "collector_records")
    assert source.sink_label == "postgres table collector_records"
    with pytest.raises(ConfigError, match="sink: type 'postgres' has no path"):
        _ = source.sink_path


@pytest.mark.parametrize(
    "dsn",
    [
        DSN,
        "postgres://u@h/db",
        "host=db port=5433 dbname=w user=app",
        "${env:COLLECTOR_PG_DSN}",
        "${secret:warehouse-dsn}",
        "postgresql://app:${secret:warehouse-pw}@db:5432/w",
    ],
)
def test_dsn_forms(tmp_path: Path, dsn: str) -> None:
    sink = {"type": "postgres", "dsn": dsn, "table": "analytics.items"}
    assert load_source(write(tmp_path, minimal(sink=sink))).sink.type == "postgres"


def test_bad_postgres_settings_are_one_line_each(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        minimal(sink={"type": "postgres", "dsn": "mysql-ish", "table": "drop table x;"}),
    )
    assert "must be a postgresql:// URL" in the_problem(path, "sink.dsn")
    assert "'drop table x;' is not a table name" in the_problem(path, "sink.table")
    missing = write(tmp_path, minimal(sink={"type": "postgres"}), "missing.yaml")
    assert the_problem(missing, "sink.dsn").endswith("required key is missing")
    mixed = write(tmp_path, minimal(sink={"type": "postgres", "dsn": DSN, "path": "out"}), "m.yaml")
    assert "unknown key" in the_problem(mixed, "sink.path")
    (line,) = problems_of(write(tmp_path, minimal(sink={"type": "kafka"}), "k.yaml"))
    assert line.endswith("sink: type must be 'jsonl' or 'postgres'"), line


def test_sink_type_still_defaults_to_jsonl(tmp_path: Path) -> None:
    source = load_source(write(tmp_path, minimal(sink={"path": "out"})))
    assert source.sink.type == "jsonl"
    assert source.sink_label == str(tmp_path.resolve() / "out")


@pytest.mark.parametrize("part", ["frontier", "deadletters"])
def test_redis_by_block_or_url_exactly_one(tmp_path: Path, part: str) -> None:
    by_block = load_source(write(tmp_path, minimal(**{part: {"type": "redis", "block": "cache"}})))
    assert getattr(by_block, part).block == "cache"
    both = {"type": "redis", "block": "cache", "url": "redis://h:6379/0"}
    assert "takes url or block, not both" in the_problem(
        write(tmp_path, minimal(**{part: both})), part
    )
    neither = write(tmp_path, minimal(**{part: {"type": "redis"}}), "n.yaml")
    assert "RedisDatabase block" in the_problem(neither, part)
    sqlite = write(tmp_path, minimal(**{part: {"type": "sqlite", "block": "x"}}), "s.yaml")
    assert "block is only for type 'redis'" in the_problem(sqlite, part)
    secret_url = {"type": "redis", "url": "${secret:redis-url}"}
    assert load_source(write(tmp_path, minimal(**{part: secret_url}), "u.yaml"))


def test_secret_reference_in_rate_storage(tmp_path: Path) -> None:
    limits = {"rate_storage": "${secret:rate-redis}", "per_domain_rate": "5/second"}
    assert load_source(write(tmp_path, minimal(limits=limits))).limits.rate_storage == (
        "${secret:rate-redis}"
    )


def test_env_reference_in_the_dsn_is_resolved_and_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTOR_TEST_PG_PW", "pg-pass-123")
    sink = {"type": "postgres", "dsn": "postgresql://app:${env:COLLECTOR_TEST_PG_PW}@db/w"}
    source = load_source(write(tmp_path, minimal(sink=sink)))
    assert isinstance(source.sink, PostgresSinkSettings)
    assert source.resolve(source.sink.dsn, field="sink.dsn") == "postgresql://app:pg-pass-123@db/w"
    assert source.secret_values() == ["pg-pass-123"]
    monkeypatch.delenv("COLLECTOR_TEST_PG_PW")
    with pytest.raises(ConfigError, match=r"^sink\.dsn: environment variable COLLECTOR_TEST_PG_PW"):
        source.resolve(source.sink.dsn, field="sink.dsn")


def test_validate_a_postgres_source_without_any_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = {"type": "postgres", "dsn": "${secret:no-such-block}", "table": "items"}
    frontier = {"type": "redis", "block": "no-such-redis"}
    path = write(tmp_path, minimal(sink=sink, frontier=frontier))
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{path}: ok (items: 1 seed URL, sink postgres table items)"
    )


def test_schema_knows_both_sinks_and_redis_blocks() -> None:
    schema = source_json_schema()
    assert {"JsonlSinkSettings", "PostgresSinkSettings"} <= set(schema["$defs"])
    assert schema["$defs"]["PostgresSinkSettings"]["required"] == ["type", "dsn"]
    assert "block" in schema["$defs"]["FrontierSettings"]["properties"]
    assert "block" in schema["$defs"]["DeadLetterSettings"]["properties"]
