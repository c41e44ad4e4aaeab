"""One exception family for everything Collector raises.

Users catch ``CollectorError``; third-party errors (httpx, sqlite3, redis, pydantic, GX) are
translated at the boundary where they happen, with the original kept as ``__cause__``::

    CollectorError
    ├── ConfigError               a source file or setting is wrong; message names the field
    │   └── SourceError           a source file is invalid; ``problems``: one line each
    │                             (collector.config)
    ├── FetchError                one URL could not be fetched or parsed
    │   ├── PermanentFetchError   retrying cannot help (404, parse error, refused URL, too large)
    │   └── RecoverableFetchError retrying may help (timeout, 429, 503, connection reset)
    ├── BackendError              a frontier, sink or dead-letter store failed or is unreachable
    ├── SourceBusy                another run holds the source's lock past the wait
    │                             (collector.run.locks; the CLI exits 3)
    ├── StoppedWaiting            a stop (Ctrl-C, SIGTERM) came while the run waited for its
    │                             source lock (collector.run.stop; nothing was claimed; the
    │                             CLI exits 130 / 143)
    ├── LostFooting               a run lost a lease, its heartbeat or its source lock: it
    │                             stopped claiming, settled or gave back what it held
    │                             (collector.run.stop; the flow run ends Failed, the CLI exits 4)
    ├── ConservationError         a run could not prove that every item reached one terminal state
    │                             (raised by the flow with ``summary``: the run's summary dict)
    └── RunFailed                 a run that balanced but cannot count as a success: every seed
                                  refused, or its hosts down (``summary``: the run's summary dict;
                                  the data of the flow run's Failed state)

A fencing token that is no longer current is not an error: the frontier and the sinks refuse
those writes and report them in their results (``AckResult.stale``, ``WriteResult.stale_keys``),
because the caller handles them item by item. Exceptions that never leave the module raising
them (``_TooLate`` and ``_Deferred`` in the fetch engine; ``BodyTooLarge`` of the bounded
decoder, which the engine turns into a ``too_large`` ``PermanentFetchError``; ``RefusedAddress``,
an ``OSError`` because aiohttp's resolver must raise one, turned into a ``PermanentFetchError``)
are outside the tree.
``tests/test_exports.py`` checks that every other exception class in ``collector`` is in it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "CollectorError",
    "ConfigError",
    "ConservationError",
    "FetchError",
    "PermanentFetchError",
    "RecoverableFetchError",
    "RunFailed",
]


class CollectorError(Exception):
    """Base of every error Collector raises on purpose."""


class ConfigError(CollectorError):
    """A source or setting is invalid. The message is one line a user can act on."""


class FetchError(CollectorError):
    """A URL could not be turned into records.

    ``error_class`` is a short stable name (``http_404``, ``timeout``, ``parse_error``...) used as
    the dead-letter reason and as a stats key; ``stage`` says which step failed.
    """

    permanent: bool = False

    def __init__(
        self,
        message: str,
        *,
        error_class: str,
        stage: str = "fetch",
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.stage = stage
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class PermanentFetchError(FetchError):
    """Retrying cannot help: the item goes straight to the dead letters."""

    permanent = True


class RecoverableFetchError(FetchError):
    """Retrying may help, after a backoff (or the server's Retry-After)."""

    permanent = False


class BackendError(CollectorError):
    """A storage backend failed; the message names the backend and where it lives."""


class ConservationError(CollectorError):
    """The run's ledger does not balance: some item is lost or counted twice.

    Raised by the ``collect`` flow with the run's summary (``RunSummary.as_dict()``) as
    ``summary``, so the failed flow run's state still says what the run did.
    """

    def __init__(self, message: str, summary: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.summary: dict[str, Any] = summary or {}


class RunFailed(CollectorError):
    """A run that balanced but ended Failed (every seed refused, or its hosts down).

    The flow run's Failed state carries it as its data, so calling the ``collect`` flow in
    process raises it (Prefect resolves a Failed state's data into the exception it raises),
    with the run's summary (``RunSummary.as_dict()``) as ``summary``.
    """

    def __init__(self, message: str, summary: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.summary: dict[str, Any] = summary or {}
