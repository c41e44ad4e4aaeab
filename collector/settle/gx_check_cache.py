"""GX's verdict on a suite's kwargs, remembered per suite content and GX version.

Only GX's own models know that ``expect_column_values_to_not_be_null`` needs a ``column``, and
asking them means importing GX: seconds, every time ``collector validate`` runs. The verdict
depends on nothing but the suite file's bytes and the installed GX, so it is kept in the user's
cache directory under a key made of both (and of :data:`CHECK_VERSION`, bumped whenever
Collector changes what it asks GX or how it words the answer): an edit to the suite, an upgrade
of GX or of the check each make a new key, so a stale verdict is never read.

Entries are written to a temporary file and renamed into place, so two processes checking the
same suite at once each leave a whole file (the same one); an entry that cannot be read or
parsed counts as absent, and a cache directory that cannot be written only costs the next run
its speed. ``COLLECTOR_CACHE_DIR`` moves the cache (tests, read-only homes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["CHECK_VERSION", "cache_dir", "cached_verdict", "verdict_key"]

CHECK_VERSION = "1"
"""Bumped when what is asked of GX, or how its answer is worded, changes."""

Verdict = list[tuple[int, str]]
"""``(position, problem)`` per refused expectation, the problem without the file's name."""

_log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$COLLECTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/collector``, else ``~/.cache/collector``."""
    explicit = os.environ.get("COLLECTOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "collector"


def _gx_version() -> str:
    try:
        return version("great_expectations")
    except PackageNotFoundError:
        return "absent"


def verdict_key(suite_bytes: bytes) -> str:
    """The entry's name: a digest of the check's version, GX's version and the suite's bytes."""
    digest = hashlib.sha256()
    for part in (CHECK_VERSION.encode(), _gx_version().encode(), suite_bytes):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def cached_verdict(suite_bytes: bytes, check: Callable[[], Verdict]) -> Verdict:
    """The verdict on ``suite_bytes``: read from the cache, or ``check()``ed and stored."""
    entry = cache_dir() / "gx-kwargs" / f"{verdict_key(suite_bytes)}.json"
    found = _read(entry)
    if found is not None:
        return found
    verdict = check()
    _write(entry, verdict)
    return verdict


def _read(entry: Path) -> Verdict | None:
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        return [(int(position), str(problem)) for position, problem in data["problems"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.debug("ignoring unreadable GX check cache entry %s: %s", entry, exc)
        return None


def _write(entry: Path, verdict: Verdict) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump({"problems": verdict}, out)
            os.replace(temporary, entry)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        _log.debug("could not store the GX check in %s: %s", entry.parent, exc)
