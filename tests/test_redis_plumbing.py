"""collector._redis: one client configuration, masked URLs, and the Lua files the backends run."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import redis

from collector import _redis
from collector._redis import Scripts, connect, describe_client, describe_url, lua_source
from collector.deadletter import redis as dl_redis
from collector.errors import BackendError
from collector.frontier import redis as fr_redis

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = [("collector.frontier", fr_redis._SCRIPTS), ("collector.deadletter", dl_redis._SCRIPTS)]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:s3cret-pw@10.0.0.1:6380/2", "redis://user:[redacted]@10.0.0.1:6380/2"),
        ("redis://:s3cret-pw@host/0", "redis://:[redacted]@host/0"),
        ("rediss://:s3cret-pw@[::1]:7000/0", "rediss://:[redacted]@[::1]:7000/0"),
        (
            "redis://host:6380/0?password=s3cret-pw&db=1",
            "redis://host:6380/0?password=[redacted]&db=1",
        ),
        ("unix:///run/redis.sock?db=3", "unix:///run/redis.sock?db=3"),
        ("redis://host:6380/0", "redis://host:6380/0"),
    ],
)
def test_describe_url_masks_the_password(url: str, shown: str) -> None:
    assert describe_url(url) == shown


def test_clients_share_one_configuration() -> None:
    client = connect("redis://127.0.0.1:1/0", what="test")  # no connection is made yet
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == _redis.SOCKET_TIMEOUT_S
    assert kwargs["socket_connect_timeout"] == _redis.CONNECT_TIMEOUT_S
    assert kwargs["health_check_interval"] == _redis.HEALTH_CHECK_INTERVAL_S
    assert describe_client(client) == "redis://127.0.0.1:1/0"
    client.close()


def test_a_malformed_url_is_one_backend_error_line() -> None:
    with pytest.raises(BackendError) as caught:
        connect("http://:s3cret-pw@host/0", what="frontier x")
    message = str(caught.value)
    assert message.startswith("frontier x: invalid Redis URL: ValueError: ")
    assert "\n" not in message


@pytest.mark.parametrize(("package", "names"), BACKENDS)
def test_every_lua_file_is_a_script_and_every_script_has_a_file(
    package: str, names: tuple[str, ...]
) -> None:
    folder = ROOT / package.replace(".", "/") / "lua"
    on_disk = {p.stem for p in folder.glob("*.lua")}
    assert on_disk == {*names, "prelude"}
    for name in names:
        assert lua_source(package, "prelude", name).startswith("-- ")


def test_lua_files_are_package_data() -> None:
    """A wheel without the .lua files would fail at the first RedisFrontier()."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["collector"]
    for path in (ROOT / "collector").rglob("*.lua"):
        relative = path.relative_to(ROOT / "collector").as_posix()
        assert any(fnmatch(relative, g) for g in globs), relative


@pytest.mark.parametrize(("package", "names"), BACKENDS)
def test_scripts_are_loaded_once_so_the_first_call_is_one_evalsha(
    redis_url: str, package: str, names: tuple[str, ...]
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        scripts = Scripts(client, package, names, prelude="prelude")
        shas = [scripts._scripts[n].sha for n in names]
        assert all(client.script_exists(*shas))
    finally:
        client.close()
