"""JSONL sink: one JSON record a line, in ``<folder>/<source>-NNNNN.jsonl`` segments.

Idempotence on append-only files: the sink keeps an index ``key -> (token, content hash,
segment, offset)``, rebuilt by scanning its segments when opened (the files are the only truth,
so there is nothing to get out of step). A record whose content is unchanged is not written; a
changed record under a token at least as new is appended and its older line marked superseded;
superseded lines are removed by compaction (rewrite to a temporary file, then an atomic rename)
when the sink closes, or when it opens and finds duplicates left by a crash.

Crash safety: each write is flushed and fsynced before it returns, so a record is durable
before the frontier hears it was stored; a line torn by a kill is cut off when the sink opens.
Each line carries ``_collector: {key, token, batch, url, stored_at}`` so compensation and
fencing can be checked from the files alone.

**One writer.** The index lives in the writing process, compaction rewrites segments and a torn
tail is cut off on open, so two processes writing one source's files would count each other's
records wrong and could lose lines. A writer holds an exclusive ``flock`` on
``.<source>.lock`` in the folder while open (released by the kernel when the process dies,
SIGKILL included); a second writer is refused in one line naming the holder (helpers need a
Postgres sink). Readers (``collector status``, ``batches``) open ``readonly``: no lock, no
truncation, no compaction, complete lines only, and no folder made (one that does not exist
holds no records: a command that only looks leaves nothing behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from collector import _json
from collector._closing import Closing
from collector.errors import BackendError
from collector.sinks._encode import digest as _digest
from collector.sinks._encode import dumps as _dumps
from collector.sinks.base import BatchSummary, SinkRecord, WriteResult

__all__ = ["JsonlSink"]

META = "_collector"
SEGMENT_BYTES = 128 * 1024 * 1024  # start a new segment past this size


# The writer locks this process holds: lock file -> (its open file, sinks using it).
_held: dict[Path, tuple[IO[str], int]] = {}
_held_lock = threading.Lock()


@dataclass(slots=True)
class _Entry:
    token: int
    digest: bytes
    segment: int
    offset: int
    batch: str
    stored_at: float | None  # the line's _collector.stored_at (None in lines without one)


class JsonlSink(Closing):
    def __init__(self, folder: str | Path, *, source: str, readonly: bool = False) -> None:
        self.folder = Path(folder)
        self.source = source
        self.readonly = readonly
        if not readonly:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BackendError(f"sink {self.folder}: cannot create folder: {exc}") from exc
        self._pattern = re.compile(rf"^{re.escape(source)}-(\d{{5}})\.jsonl$")
        self._index: dict[str, _Entry] = {}
        self._superseded: set[int] = set()  # segments holding superseded lines
        self._handle: IO[bytes] | None = None
        self._segment = 0
        self._lock: IO[str] | None = None if readonly else self._take_writer_lock()
        try:
            self._load()
        except BaseException:
            self._release_writer_lock()
            raise

    def _take_writer_lock(self) -> IO[str]:
        """The one-writer lock (module docstring); refused in one line while another process
        holds it. Sinks of one process share its lock (counted): a flock is per open file, and
        what the lock guards against is another process."""
        path = (self.folder / f".{self.source}.lock").resolve()
        # Held from the look-up to the registration: two threads of this process opening the
        # sink at once would otherwise both miss it in `_held`, and the second's flock (on a
        # file of its own) would refuse it as if another process wrote (seen with two triage
        # runs in threads).
        with _held_lock:
            if path in _held:
                handle, users = _held[path]
                _held[path] = (handle, users + 1)
                return handle
            handle = path.open("a+", encoding="utf-8")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise BackendError(
                    f"sink {self.folder}: the JSONL sink of {self.source} is being written by "
                    f"{holder}; a JSONL sink has one writer: wait for it to end, or use a "
                    "postgres sink to run `collector work` helpers beside a run"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            _held[path] = (handle, 1)
            return handle

    def _release_writer_lock(self) -> None:
        handle, self._lock = self._lock, None
        if handle is None:
            return
        path = Path(handle.name)
        with _held_lock:
            _, users = _held.get(path, (handle, 1))
            if users > 1:
                _held[path] = (handle, users - 1)
                return
            _held.pop(path, None)
        with contextlib.suppress(OSError):
            handle.truncate(0)
        handle.close()  # closing the file releases the flock

    def location(self) -> str:
        return str(self.folder)

    def _segment_path(self, segment: int) -> Path:
        return self.folder / f"{self.source}-{segment:05d}.jsonl"

    def _segments(self) -> list[int]:
        if self.readonly and not self.folder.is_dir():
            return []  # not made yet (or not a folder): nothing stored here
        found = []
        for path in self.folder.iterdir():
            match = self._pattern.match(path.name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    # --- opening -------------------------------------------------------------------------------
    def _load(self) -> None:
        segments = self._segments()
        for segment in segments:
            self._scan(segment)
        if self._superseded and not self.readonly:
            self._compact()
        self._segment = segments[-1] if segments else 1

    def _scan(self, segment: int) -> None:
        path = self._segment_path(segment)
        with path.open("rb" if self.readonly else "r+b") as handle:
            data = handle.read()
            end = data.rfind(b"\n") + 1
            if end != len(data) and not self.readonly:
                handle.truncate(end)  # a torn last line from a crash: never acked, cut it off
        offset = 0
        for line in data[:end].splitlines(keepends=True):
            try:
                row = _json.loads(line)
                meta = row.pop(META)
                key, token, batch = str(meta["key"]), int(meta["token"]), str(meta["batch"])
            except (KeyError, TypeError, ValueError) as exc:  # ValueError: not JSON
                raise BackendError(
                    f"sink {path}: byte {offset}: not a Collector record line ({exc})"
                ) from exc
            stored = meta.get("stored_at")
            stored_at = float(stored) if isinstance(stored, (int, float)) else None
            entry = _Entry(token, _digest(row), segment, offset, batch, stored_at)
            previous = self._index.get(key)
            if previous is not None:
                self._superseded.add(previous.segment if token >= previous.token else segment)
            if previous is None or token >= previous.token:
                self._index[key] = entry
            offset += len(line)

    # --- writing -------------------------------------------------------------------------------
    def _open_segment(self) -> IO[bytes]:
        if self._handle is None:
            self._handle = self._segment_path(self._segment).open("ab")
        elif self._handle.tell() >= SEGMENT_BYTES:
            self._handle.close()
            self._segment += 1
            self._handle = self._segment_path(self._segment).open("ab")
        return self._handle

    def write(self, records: Sequence[SinkRecord], *, token: int, batch_id: str) -> WriteResult:
        self._writable()
        result = WriteResult()
        if not records:
            return result
        handle = self._open_segment()
        offset = handle.seek(0, os.SEEK_END)
        lines: list[bytes] = []
        pending: dict[str, _Entry] = {}
        stored_at = time.time()
        for item in records:
            digest = _digest(item.record)
            previous = pending.get(item.key) or self._index.get(item.key)
            if previous is not None:
                if token < previous.token:
                    result.stale += 1
                    result.stale_keys.append(item.key)
                    continue
                if previous.digest == digest:
                    # Nothing to write, but the newer token now guards the key (in this
                    # process: the JSONL sink has one writer; Postgres fences across workers).
                    previous.token = max(previous.token, token)
                    result.unchanged += 1
                    continue
                self._superseded.add(previous.segment)
            meta = {"key": item.key, "token": token, "batch": batch_id, "url": item.url}
            line = _dumps({**item.record, META: {**meta, "stored_at": stored_at}}) + b"\n"
            pending[item.key] = _Entry(token, digest, self._segment, offset, batch_id, stored_at)
            offset += len(line)
            lines.append(line)
            result.written += 1
            result.written_urls.add(item.url)
        if lines:
            try:
                handle.write(b"".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as exc:
                raise BackendError(f"sink {self.folder}: write failed: {exc}") from exc
            self._index.update(pending)
        return result

    # --- reading and compensation --------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._index.get(key)
        if entry is None:
            return None
        row = self._line(entry)
        row.pop(META, None)
        return row

    def _line(self, entry: _Entry) -> dict[str, Any]:
        """The stored line ``entry`` points at, with its ``_collector`` metadata."""
        if self._handle is not None:
            self._handle.flush()
        with self._segment_path(entry.segment).open("rb") as handle:
            handle.seek(entry.offset)
            row: dict[str, Any] = _json.loads(handle.readline())
        return row

    def count(self) -> int:
        return len(self._index)

    def batches(self) -> list[str]:
        return sorted({entry.batch for entry in self._index.values()})

    def batch_summaries(self) -> list[BatchSummary]:
        counts: dict[str, int] = {}
        written: dict[str, float] = {}
        for entry in self._index.values():
            counts[entry.batch] = counts.get(entry.batch, 0) + 1
            if entry.stored_at is not None:
                written[entry.batch] = max(written.get(entry.batch, 0.0), entry.stored_at)
        return [BatchSummary(b, counts[b], written.get(b)) for b in sorted(counts)]

    def records(self, batch_id: str) -> list[SinkRecord]:
        keys = sorted(key for key, entry in self._index.items() if entry.batch == batch_id)
        found = []
        for key in keys:
            row = self._line(self._index[key])
            meta = row.pop(META)
            found.append(SinkRecord(key, row, str(meta["url"])))
        return found

    def _writable(self) -> None:
        if self.readonly:
            raise BackendError(f"sink {self.folder}: opened read-only (no writes)")

    def remove_batch(self, batch_id: str) -> int:
        self._writable()
        doomed = [key for key, entry in self._index.items() if entry.batch == batch_id]
        for key in doomed:
            self._superseded.add(self._index.pop(key).segment)
        self._compact()
        return len(doomed)

    def _compact(self) -> None:
        """Rewrite segments so each holds only the lines the index points at."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        keep: dict[int, set[int]] = {}
        for entry in self._index.values():
            keep.setdefault(entry.segment, set()).add(entry.offset)
        for segment in sorted(self._superseded):
            path = self._segment_path(segment)
            if not path.exists():
                continue
            wanted = keep.get(segment, set())
            temporary = path.with_suffix(".jsonl.tmp")
            new_offsets: dict[int, int] = {}
            with path.open("rb") as source, temporary.open("wb") as target:
                offset = 0
                for line in source:
                    if offset in wanted:
                        new_offsets[offset] = target.tell()
                        target.write(line)
                    offset += len(line)
                target.flush()
                os.fsync(target.fileno())
            os.replace(temporary, path)
            for entry in self._index.values():
                if entry.segment == segment:
                    entry.offset = new_offsets[entry.offset]
        self._superseded.clear()

    def close(self) -> None:
        """Compact, then let go of the files and the writer lock, the lock even when the
        compaction fails (a full disk, a folder gone): the lines on disk are whole either way
        (the next open compacts them), and a lock kept by a process that lives on (a worker, a
        test session) refused every other writer of the source until that process ended."""
        try:
            if self._superseded and not self.readonly:
                self._compact()
        finally:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            self._release_writer_lock()
