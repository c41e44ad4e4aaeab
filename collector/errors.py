"""One exception family for everything Collector raises.

Users catch ``CollectorError``; third-party errors (httpx, sqlite3, redis, pydantic, GX) are
translated at the boundary where they happen, with the original kept as ``__cause__``::

    CollectorError
    ├── ConfigError               a source file or setting is wrong; message names the field
    ├── FetchError                one URL could not be fetched or parsed
    │   ├── PermanentFetchError   retrying cannot help (404, parse error, refused URL, too large)
    │   └── RecoverableFetchError retrying may help (timeout, 429, 503, connection reset)
    ├── BackendError              a frontier, sink or dead-letter store failed or is unreachable
    │   └── StaleLeaseError       a write or ack carried a fencing token that is no longer current
    └── ConservationError         a run could not prove that every item reached one terminal state
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CollectorError",
    "ConfigError",
    "ConservationError",
    "FetchError",
    "PermanentFetchError",
    "RecoverableFetchError",
    "StaleLeaseError",
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


class StaleLeaseError(BackendError):
    """A fencing token older than the current one was presented; the write is refused."""


class ConservationError(CollectorError):
    """The run's ledger does not balance: some item is lost or counted twice."""
