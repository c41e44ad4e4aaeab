"""Values kept in Prefect blocks: ``${secret:NAME}`` (a ``Secret`` block) and Redis backends
named by a prefect-redis ``RedisDatabase`` block.

Loaded only when a run starts (``collector validate`` never needs a server), through the Prefect
API the process is configured for. Prefect is imported here and only here, lazily, so the engine
stays usable without it. Every value loaded is remembered in this process so that
:meth:`collector.config.Source.secret_values` can have it scrubbed from what Collector writes.

A block that is missing, or an API that cannot be reached, is one :class:`ConfigError` line
naming the source field and the block.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from collector.errors import ConfigError

__all__ = ["known_secret", "load_secret", "redis_url_from_block"]

# Process-wide: the scrubber (ops/scrub.py) must hide a secret from every later line of the
# process, whichever run logs it; one entry per Secret block named, so bounded by the config.
_loaded: dict[tuple[str, str], str] = {}  # (kind, block name) -> secret value seen
_lock = threading.Lock()


def known_secret(kind: str, name: str) -> str | None:
    """The value last loaded from block ``name`` (``kind`` "secret" or "redis"), if any."""
    with _lock:
        return _loaded.get((kind, name))


def _remember(kind: str, name: str, value: str) -> None:
    with _lock:
        _loaded[(kind, name)] = value


def _load_block(block_class: Any, label: str, name: str, *, field: str) -> Any:
    try:
        return block_class.load(name, _sync=True)
    except ValueError as exc:
        if "Unable to find block document" in str(exc):
            raise ConfigError(f"{field}: Prefect {label} block {name!r} not found") from None
        raise ConfigError(f"{field}: cannot load Prefect {label} block {name!r}: {exc}") from exc
    except Exception as exc:  # the API is down, refused us, or answered nonsense
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"{field}: cannot load Prefect {label} block {name!r}: {reason}") from exc


def load_secret(name: str, *, field: str) -> str:
    """The string held by the Prefect ``Secret`` block ``name``."""
    from prefect.blocks.system import Secret

    value = _load_block(Secret, "Secret", name, field=field).get()
    if not isinstance(value, str):
        raise ConfigError(
            f"{field}: Prefect Secret block {name!r} holds a {type(value).__name__}, not a string"
        )
    _remember("secret", name, value)
    return value


def redis_url_from_block(name: str, *, field: str) -> str:
    """A ``redis://`` URL built from the prefect-redis ``RedisDatabase`` block ``name``."""
    from prefect_redis import RedisDatabase

    params = _load_block(RedisDatabase, "RedisDatabase", name, field=field).as_connection_params()
    url = params.get("connection_url")
    if url:
        if "+sentinel" in url.split("://", 1)[0]:
            raise ConfigError(
                f"{field}: RedisDatabase block {name!r} uses Redis Sentinel, which the "
                "Collector backends do not support; give the master's redis:// URL"
            )
    else:
        username = params.get("username") or ""
        password = params.get("password") or ""
        userinfo = ""
        if username or password:
            userinfo = f"{quote(username, safe='')}:{quote(password, safe='')}@"
        scheme = "rediss" if params.get("ssl") else "redis"
        url = f"{scheme}://{userinfo}{params['host']}:{params['port']}/{params.get('db', 0)}"
    try:
        in_url = urlsplit(str(url)).password
    except ValueError:
        in_url = None
    password = params.get("password") or (unquote(in_url) if in_url else None)
    if password:
        _remember("redis", name, str(password))
    return str(url)
