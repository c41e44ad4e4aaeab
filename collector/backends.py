"""Open the backends a source names: embedded SQLite/JSONL by default, Redis when configured.

The one place that maps settings to backend classes, so the pipeline (and the flows) never
branch on backend types. Redis backends are imported only when used; an unreachable server
fails here, at the start of a run, with one line naming it (BackendError), not deep inside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collector.config import Source
    from collector.deadletter.base import DeadLetterStore
    from collector.frontier.base import Frontier
    from collector.sinks.base import Sink

__all__ = ["open_deadletters", "open_frontier", "open_sink"]


def open_frontier(source: Source) -> Frontier:
    settings = source.frontier
    if settings.type == "redis":
        from collector.frontier.redis import RedisFrontier

        assert settings.url is not None
        return RedisFrontier(source.resolve_env(settings.url, field="frontier.url"))
    from collector.frontier.sqlite import SqliteFrontier

    return SqliteFrontier(source.frontier_path)


def open_deadletters(source: Source) -> DeadLetterStore:
    settings = source.deadletters
    if settings.type == "redis":
        from collector.deadletter.redis import RedisDeadLetterStore

        assert settings.url is not None
        return RedisDeadLetterStore(
            source.resolve_env(settings.url, field="deadletters.url"),
            archive=source.deadletter_archive_path,
            archive_max_bytes=settings.archive_max_bytes,
        )
    from collector.deadletter.sqlite import SqliteDeadLetterStore

    return SqliteDeadLetterStore(
        source.deadletter_path,
        archive=source.deadletter_archive_path,
        archive_max_bytes=settings.archive_max_bytes,
    )


def open_sink(source: Source) -> Sink:
    from collector.sinks.jsonl import JsonlSink

    return JsonlSink(source.sink_path, source=source.name)
