"""Remove secrets from anything Collector writes: logs, artifacts, dead letters, Sentry events.

Two kinds of secrets are removed: *known values* (resolved ``${env:...}`` headers, Prefect Secret
block values), replaced wherever they appear in a string; and *secret-looking fields*: URL query
parameters and mapping keys named like credentials (``token``, ``api_key``, ``password``,
``authorization``...), whose values are replaced whatever they are.

Values are known per process once a source is loaded (:func:`remember_secrets`), and from then
on every log record any handler emits is scrubbed too (:class:`ScrubLogRecords`): Prefect's own
lines, such as "Finished in state Failed(...)" with an exception's text, included.

Why per process and not per run: log handlers, Sentry's client and Prefect's API log worker
are the process's, and a record does not know which run's secret it may carry (Prefect's own
lines, a helper thread's, another run's in the same worker). A scrubber scoped to one run would
let that run's secret through a line logged for the next; removing every secret the process
has seen from every line is the only scope that never leaks.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "REDACTED",
    "ScrubLogRecords",
    "Scrubber",
    "is_secret_name",
    "process_scrubber",
    "remember_secrets",
]

REDACTED = "[redacted]"
# Matched against names split at case changes and lowered ("apiKey" -> "api_key"), as whole
# words, so "passenger" or "author" are not secrets but "x-api-key" and "authToken" are.
_SECRET_WORDS = (
    r"pass(word|wd)?|secret|token|api[-_]?key|apikey|auth(orization|_token)?|credentials?|"
    r"session(_?id)?|cookie|private[-_]?key|signature|sig|access[-_]?key|client[-_]?secret"
)
_SECRET_NAME = re.compile(rf"(?<![a-z0-9])({_SECRET_WORDS})(?![a-z0-9])")
_SECRET_QUERY_NAME = re.compile(rf"(?<![a-z0-9])({_SECRET_WORDS}|key)(?![a-z0-9])")
_CASE_CHANGE = re.compile(r"([a-z0-9])([A-Z])")


def _words(name: str) -> str:
    return _CASE_CHANGE.sub(r"\1_\2", name).lower()


def is_secret_name(name: str, *, in_url: bool = False) -> bool:
    """True for field or parameter names that hold credentials."""
    pattern = _SECRET_QUERY_NAME if in_url else _SECRET_NAME
    return pattern.search(_words(name)) is not None


_MIN_SECRET_LEN = 4  # shorter "secrets" would redact ordinary text


class Scrubber:
    """Callable that returns a copy of a value with secrets replaced by ``[redacted]``."""

    def __init__(self, secret_values: Iterable[str] = ()) -> None:
        values = sorted({v for v in secret_values if v and len(v) >= _MIN_SECRET_LEN}, key=len)
        self._values = values[::-1]  # longest first, so a secret containing another is whole
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in self._values)) if self._values else None
        )

    def add(self, *secret_values: str) -> Scrubber:
        return Scrubber([*self._values, *secret_values])

    def text(self, value: str) -> str:
        if self._pattern is not None:
            value = self._pattern.sub(REDACTED, value)
        if "://" in value:
            value = re.sub(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+", self._url_match, value)
        return value

    def url(self, value: str) -> str:
        try:
            parts = urlsplit(value)
        except ValueError:
            return value
        netloc = parts.netloc
        if "@" in netloc:  # user:password@host
            netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(is_secret_name(name, in_url=True) for name, _ in pairs):
                query = urlencode(
                    [(n, REDACTED if is_secret_name(n, in_url=True) else v) for n, v in pairs],
                    safe="[]",
                )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))

    def _url_match(self, match: re.Match[str]) -> str:
        return self.url(match.group(0))

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                key: (
                    REDACTED
                    if isinstance(key, str) and value[key] and is_secret_name(key)
                    else self(item)
                )
                for key, item in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self(item) for item in value]
        return value


# --- secrets known to this process ---------------------------------------------------------

# Process-wide: log handlers are the process's, so a secret is hidden from every later line
# whichever run logs it. Bounded: past SECRETS_KEPT values the one learnt or given least recently
# is forgotten (a process that learns that many is rotating them: the old values are out of use).
SECRETS_KEPT = 1_024
_known_lock = threading.Lock()
_known: dict[str, None] = {}  # the values, least recently learnt or given first
_process_scrubber = Scrubber()


def process_scrubber() -> Scrubber:
    """The scrubber for every secret value this process has learnt so far."""
    return _process_scrubber


def remember_secrets(values: Iterable[str]) -> None:
    """Learn resolved secret values; scrub them from every log record from now on.

    Also (re)attaches :class:`ScrubLogRecords` to every configured log handler, so handlers
    set up after an earlier call (Prefect configures its own lazily) are covered as well.
    """
    global _process_scrubber
    given = [v for v in values if v]
    with _known_lock:
        new = [v for v in given if v not in _known]
        for value in given:  # learnt or given again last: forgotten last
            _known.pop(value, None)
            _known[value] = None
        if new:
            while len(_known) > SECRETS_KEPT:
                del _known[next(iter(_known))]
            _process_scrubber = Scrubber(_known)
    install_log_scrubbing()


class ScrubLogRecords(logging.Filter):
    """A handler filter that removes secrets from a record's message and traceback text.

    On handlers rather than loggers: a logger's filters do not see records propagated from its
    children, a handler's see every record it is about to emit. Records that hold no secret are
    left exactly as they are.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        scrub = _process_scrubber
        message = record.getMessage()
        clean = scrub.text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            text = self._formatter.formatException(record.exc_info)
            clean = scrub.text(text)
            if clean != text:
                record.exc_text = clean  # formatters use exc_text when it is set
        return True


_LOG_FILTER = ScrubLogRecords()


def install_log_scrubbing() -> None:
    """Attach the scrubbing filter to every handler of every logger configured now."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [
        logger
        for logger in list(logging.Logger.manager.loggerDict.values())
        if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            if _LOG_FILTER not in handler.filters:
                handler.addFilter(_LOG_FILTER)
