"""Open the backends a source names: embedded SQLite/JSONL by default, Redis or Postgres when
configured.

The one place that maps settings to backend classes, so the pipeline (and the flows) never
branch on backend types. Redis and Postgres backends are imported only when used; an unreachable
server fails here, at the start of a run, with one line naming it (BackendError), not deep
inside it. Secrets (``${env:}``, ``${secret:}``, RedisDatabase blocks) are resolved here too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.config import DeadLetterSettings, FrontierSettings, Source
    from collector.deadletter.archive import JsonlArchive
    from collector.deadletter.base import DeadLetters
    from collector.frontier.base import Frontier
    from collector.sinks.base import Sink

__all__ = [
    "Backends",
    "open_archive",
    "open_backends",
    "open_deadletters",
    "open_frontier",
    "open_sink",
]


def _redis_url(
    source: Source, settings: FrontierSettings | DeadLetterSettings, *, field: str
) -> str:
    """The Redis URL of a backend: from its RedisDatabase block, or its (resolved) url."""
    if settings.block is not None:
        from collector.ops.secrets import redis_url_from_block

        return redis_url_from_block(settings.block, field=f"{field}.block")
    from collector.config import redis_url_checked

    assert settings.url is not None
    return redis_url_checked(source.resolve(settings.url, field=f"{field}.url"), field=field)


@contextlib.contextmanager
def _naming(field: str, store: str) -> Iterator[None]:
    """A server store that cannot open names the setting that points at it, so the operator
    knows what to fix: ``frontier redis://h:1/0: cannot connect: ...`` becomes ``frontier.url
    redis://h:1/0: cannot connect: ...`` (the store's own message, URL already scrubbed; the
    CLI puts the source file in front, flows.cli)."""
    from collector.errors import BackendError

    try:
        yield
    except BackendError as exc:
        raise BackendError(f"{field} {str(exc).removeprefix(store + ' ')}") from exc


def open_frontier(source: Source, *, existing_only: bool = False) -> Frontier:
    """``existing_only`` for commands that only read: an embedded (SQLite) frontier that does
    not exist yet is not created; it reads as empty (see SqliteFrontier)."""
    settings = source.frontier
    if settings.type == "redis":
        from collector.frontier.redis import RedisFrontier

        url = _redis_url(source, settings, field="frontier")
        field = "frontier.block" if settings.block is not None else "frontier.url"
        with _naming(field, "frontier"):
            return RedisFrontier(url)
    from collector.frontier.sqlite import SqliteFrontier

    return SqliteFrontier(source.frontier_path, existing_only=existing_only)


def open_deadletters(source: Source, *, existing_only: bool = False) -> DeadLetters:
    """``existing_only`` as for :func:`open_frontier`."""
    settings = source.deadletters
    if settings.type == "redis":
        from collector.deadletter.redis import RedisDeadLetterStore

        url = _redis_url(source, settings, field="deadletters")
        field = "deadletters.block" if settings.block is not None else "deadletters.url"
        with _naming(field, "dead letters"):
            return RedisDeadLetterStore(
                url,
                archive=source.deadletter_archive_path,
                archive_max_bytes=settings.archive_max_bytes,
            )
    from collector.deadletter.sqlite import SqliteDeadLetterStore

    return SqliteDeadLetterStore(
        source.deadletter_path,
        archive=source.deadletter_archive_path,
        archive_max_bytes=settings.archive_max_bytes,
        existing_only=existing_only,
    )


def open_archive(source: Source) -> JsonlArchive:
    """The source's dead-letter archive, for reading (the triage balance counts from it)."""
    from collector.deadletter.archive import JsonlArchive

    return JsonlArchive(
        source.deadletter_archive_path, max_bytes=source.deadletters.archive_max_bytes
    )


def open_sink(source: Source, *, readonly: bool = False) -> Sink:
    """The source's sink; ``readonly`` for commands that only look (a JSONL sink then takes no
    writer lock, so ``status`` works beside a run; see collector.sinks.jsonl)."""
    settings = source.sink
    if settings.type == "postgres":
        from collector.sinks.postgres import PostgresSink

        dsn = source.resolve(settings.dsn, field="sink.dsn")
        with _naming("sink.dsn", "sink"):
            return PostgresSink(dsn, source=source.name, table=settings.table)
    from collector.sinks.jsonl import JsonlSink

    return JsonlSink(source.sink_path, source=source.name, readonly=readonly)


@dataclass(frozen=True, slots=True)
class Backends:
    """A source's three stores, open together (see :func:`open_backends`)."""

    frontier: Frontier
    deadletters: DeadLetters
    sink: Sink


@contextlib.contextmanager
def open_backends(
    source: Source, *, readonly_sink: bool = False, existing_only: bool = False
) -> Iterator[Backends]:
    """Open the source's frontier, dead-letter store and sink; close every one that opened.

    ``readonly_sink``: the sink takes no writer lock. ``existing_only`` for commands that only
    read (``status``): embedded SQLite stores that do not exist yet are not created; they read
    as empty.

    Opened in that order, so an unreachable server fails here with its one-line BackendError
    (or a ConfigError for a missing variable) before anything was changed; whatever opened before
    the failure is closed again.
    """
    with contextlib.ExitStack() as stack:
        frontier = open_frontier(source, existing_only=existing_only)
        stack.callback(frontier.close)
        deadletters = open_deadletters(source, existing_only=existing_only)
        stack.callback(deadletters.close)
        sink = open_sink(source, readonly=readonly_sink)
        stack.callback(sink.close)
        yield Backends(frontier, deadletters, sink)
