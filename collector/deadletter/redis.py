"""Redis dead-letter store: shared by every worker, with a replayable history and a review queue.

Behaves like :class:`collector.deadletter.sqlite.SqliteDeadLetterStore` (same upsert, filters,
counts, reasons, resolve-once) so pipelines can switch backends without noticing. On top of
that it offers a manual-review queue built on a Redis Stream consumer group, so several humans
(or tools) can share the triage of escalated entries without two of them working on one entry.

Keys (``P`` is ``{prefix}:dl:``; variable parts inside index keys have ``%`` and ``:``
percent-escaped so that no two indexes can share a name)::

    P{id}                              HASH   one entry (payload / failed_expectations as JSON)
    Pix:seen                           ZSET   every id by last_seen   (list order, no source)
    Pix:seen:{source}                  ZSET   ids of a source by last_seen
    Pix:status:{status}[:{source}]     SET    ids per status, globally and per source
    Pix:stage:{stage}[:{source}]       SET    ids per stage, globally and per source
    Pix:class:{class}                  SET    ids whose error class is {class}
    Pix:reasons:{status}:{source}      HASH   reason_label ("stage/[cause:]class") -> entries
    Pmeta                              HASH   epoch token (detects that the data vanished), layout
    Pevents                            STREAM every history event (quarantined/escalated/resolved)
    Preview:{source}                   STREAM escalated entries, consumer group ``reviewers``
    Preq:{request id}                  STRING reply of a state-changing call, for a resend of it
                                              (10 min; ids hold no ``:``, so no entry is named so)

Layout versions (``layout`` in ``Pmeta``), migrated on open: 1 (no ``layout`` field) encoded the
cause in ``error_class`` (``retries_exhausted:http_500``, indexed under every ``:``-suffix), the
resolution kind in the ``resolution`` text, and kept one review stream ``Preview`` for every
source; 2 keeps ``cause``, ``resolution_kind`` and ``trace_id`` as fields of their own and one
review stream per source (``lua/migrate.lua``, one chunk of entries per call, idempotent).
An entry's ``url_digest`` and ``span_id`` fields came later without a layout change: entries
written before have none (read as ``""``).

Every operation is one Lua script, a file in ``collector/deadletter/lua/`` (one round trip, atomic:
no other client can interleave, so the indexes, the counters and the event stream always agree
with the entries). Scripts validate before their first write, so an error never leaves a
half-applied change behind. The client and its error translation are :mod:`collector._redis`'s.

Redis without persistence forgets everything on restart; a store that then kept answering "no
dead letters" would silently lose the quarantined items. Each script therefore checks the epoch
token it read from ``Pmeta`` at construction: if the token is gone or different, the call raises
:class:`~collector.errors.BackendError` once, the store adopts the new state and carries on (so
new failures can still be quarantined).
"""

from __future__ import annotations

import builtins
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import redis

from collector import _json, defaults
from collector._closing import Closing
from collector._redis import Scripts, backend_error, client_for
from collector.deadletter.archive import JsonlArchive
from collector.deadletter.base import (
    Census,
    DeadLetter,
    ResolutionKind,
    check_kind,
    count_status_kinds,
)
from collector.errors import BackendError

__all__ = ["REVIEW_GROUP", "RedisDeadLetterStore"]

REVIEW_GROUP = "reviewers"
_STATUSES = ("open", "review", "resolved")
_RESERVED_IDS = frozenset({"meta", "events", "review"})  # would collide with the store's keys
_LOST = "DLLOST"  # error prefix raised by the scripts when the epoch token does not match
_MISMATCH = "DLMISMATCH"
_CANDIDATES_MAX = 5000  # list(): below this size, read the smallest filter set instead of scanning
# The scripts, in lua/<name>.lua, each run after lua/prelude.lua: ARGV[1] is the key prefix
# "{prefix}:dl:", ARGV[2] the epoch token, KEYS[1] the meta key; the epoch check runs before any
# write. Every file says its other arguments and its reply.
LAYOUT = "2"
_MIGRATE_CHUNK = 500  # entries per migration script call
_SCRIPTS = (
    "migrate",
    "put_back",
    "put",
    "get",
    "list",
    "counts",
    "reasons",
    "census",
    "resolve",
    "escalate",
    "finish",
    "load_reviews",
    "take_entry",
    "claim",
    "release",
    "ping",
)
# What a resend may do when a reply was lost (collector._redis): these record their reply under a
# request id (Preq:<id>) and return it to a resend of the same call without running again (a put
# run twice would log its events twice, a resolve run twice would answer "not resolved") ...
_REPLAYED = frozenset({"put", "put_back", "resolve", "escalate", "finish", "release", "take_entry"})
# ... these read, or write what a second run writes again and answer the same (migrate skips
# migrated entries; a triage claim taken again by its owner; load_reviews drops moot messages).
_RESENT = frozenset(
    {"migrate", "get", "list", "counts", "reasons", "census", "load_reviews", "claim", "ping"}
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _encode_json(payload: Any, failed: Any) -> tuple[bytes, bytes, str]:
    """Both as :mod:`collector._json` writes them, and the codec name stored with the entry.

    The name only mattered before one codec read everything exactly (entries written then say
    ``orjson`` or ``json``); every entry is now read with :func:`collector._json.loads`.
    """
    return _json.dumps(payload), _json.dumps(failed), "json"


def _from_hash(h: dict[str, str]) -> DeadLetter:
    return DeadLetter(
        id=h["id"],
        source=h["source"],
        url=h["url"],
        stage=h["stage"],  # type: ignore[arg-type]  # stored from a Stage
        error_class=h["error_class"],
        message=h["message"],
        attempts=int(h["attempts"]),
        first_seen=float(h["first_seen"]),
        last_seen=float(h["last_seen"]),
        record_key=h.get("record_key", ""),
        payload=_json.loads(h["payload"]),
        failed_expectations=_json.loads(h["failed_expectations"]),
        flow_run_id=h.get("flow_run_id"),
        status=h["status"],  # type: ignore[arg-type]  # stored from a Status
        resolution=h.get("resolution"),
        requeues=int(h.get("requeues", 0)),
        cause=h.get("cause", ""),
        resolution_kind=check_kind(h["resolution_kind"]) if h.get("resolution_kind") else None,
        trace_id=h.get("trace_id", ""),
        url_digest=h.get("url_digest", ""),
        span_id=h.get("span_id", ""),
    )


def _esc(text: str) -> str:
    """The key escaping of the scripts' ``esc``: ``%`` and ``:`` percent-encoded."""
    return text.replace("%", "%25").replace(":", "%3A")


def _float(value: float, what: str, entry_id: str) -> str:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"dead letter {entry_id}: {what} must be a finite number, not {value!r}")
    return repr(number)


def _check_id(entry_id: str) -> None:
    if not entry_id or ":" in entry_id or entry_id in _RESERVED_IDS:
        raise ValueError(f"dead-letter id {entry_id!r} cannot be used as a Redis key")


def _usable_id(entry_id: str) -> bool:
    return bool(entry_id) and ":" not in entry_id and entry_id not in _RESERVED_IDS


class RedisDeadLetterStore(Closing):
    """Dead letters in Redis, shared by every worker that uses the same URL and prefix.

    ``url_or_client`` is a ``redis://`` URL (the store then owns its client, which waits for a
    restarted server and sends a script whose reply was lost again, a state-changing one with
    the same request id so that it runs once: see :mod:`collector._redis`) or a ready
    ``redis.Redis`` client (used as it is, nothing sent again, never closed by the store).
    ``archive`` adds the local append-only JSONL history of the SQLite store; the
    ``{prefix}:dl:events`` stream is the shared one, trimmed to about ``events_maxlen`` events.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "collector",
        archive: str | Path | None = None,
        events_maxlen: int = 1_000_000,
        archive_max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES,
    ) -> None:
        if events_maxlen < 1:
            raise ValueError("events_maxlen must be at least 1")
        self.prefix = prefix
        self.events_maxlen = events_maxlen
        self._client, self.url, self._owns_client = client_for(url_or_client, what="dead letters")
        self._base = f"{prefix}:dl:"
        self.events_key = self._base + "events"
        self._old_review_key = self._base + "review"  # layout 1: one stream for all sources
        self._meta_key = self._base + "meta"
        self.archive = JsonlArchive(archive, max_bytes=archive_max_bytes) if archive else None
        self._lock = threading.Lock()
        self._groups_ready: set[str] = set()
        self._epoch = ""
        try:
            with self._errors("cannot connect"):
                self._scripts = Scripts(
                    self._client, __package__, _SCRIPTS, replayed=_REPLAYED, resent=_RESENT
                )
                self._adopt_epoch()
            self._migrate()
        except BackendError:
            self.close()
            raise

    # --- plumbing ------------------------------------------------------------------------

    def location(self) -> str:
        return f"{self.url} (prefix {self.prefix!r})"

    def _adopt_epoch(self) -> None:
        """Mark the data as ours (first store on it) or take the current mark."""
        pipe = self._client.pipeline(transaction=False)
        pipe.hsetnx(self._meta_key, "epoch", uuid.uuid4().hex)
        pipe.hsetnx(self._meta_key, "created", repr(time.time()))
        pipe.hget(self._meta_key, "epoch")
        epoch = pipe.execute()[-1]
        with self._lock:
            self._epoch = _text(epoch)
            self._groups_ready = set()

    def _migrate(self) -> None:
        """Bring the data to :data:`LAYOUT` (see the module docstring); nothing when it is."""
        with self._errors("cannot read the layout"):
            if _text(self._client.hget(self._meta_key, "layout") or "") == LAYOUT:
                return
            start = 0
            while ids := self._client.zrange(self._base + "ix:seen", start, start + 999):
                for i in range(0, len(ids), _MIGRATE_CHUNK):
                    self._run("migrate", "migration failed", *ids[i : i + _MIGRATE_CHUNK])
                start += len(ids)
            self._client.delete(self._old_review_key)
            self._client.hset(self._meta_key, "layout", LAYOUT)

    def review_key(self, source: str) -> str:
        """The review stream of ``source``."""
        return f"{self._base}review:{_esc(source)}"

    def _fail(self, what: str, exc: BaseException) -> NoReturn:
        raise backend_error(f"dead letters {self.url}: {what}", exc) from exc

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Every Redis failure becomes one BackendError line naming the (scrubbed) URL."""
        try:
            yield
        except redis.ResponseError as exc:
            text = str(exc)
            if text.startswith(_MISMATCH):
                raise ValueError(text.removeprefix(_MISMATCH).strip()) from None
            if text.startswith(_LOST):
                with suppress(redis.RedisError, OSError):  # unreachable: the next call says so
                    self._adopt_epoch()
                raise BackendError(
                    f"dead letters {self.url}: {what}: the dead-letter data under prefix"
                    f" {self.prefix!r} is gone (server restarted without persistence, flushed"
                    " or failed over); entries stored before are lost"
                ) from exc
            self._fail(what, exc)
        except (redis.RedisError, OSError) as exc:
            self._fail(what, exc)

    def _run(self, name: str, what: str, *args: Any) -> Any:
        with self._errors(what):
            return self._scripts(
                name,
                [self._meta_key],
                [self._base, self._epoch, *args],
                records=self._base + "req:",
            )

    def _ensure_group(self, stream: str, *, force: bool = False) -> None:
        """Create the reviewers group of a stream once (from its start: nothing is skipped)."""
        if stream in self._groups_ready and not force:
            return
        with self._errors("cannot create the review group"):
            try:
                self._client.xgroup_create(stream, REVIEW_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready.add(stream)

    def _with_group(self, stream: str, what: str, call: Callable[[], Any]) -> Any:
        """Run a consumer-group command, re-creating the group once if the server lost it."""
        self._ensure_group(stream)
        for attempt in (1, 2):
            with self._errors(what):
                try:
                    return call()
                except redis.ResponseError as exc:
                    if "NOGROUP" not in str(exc) or attempt == 2:
                        raise
            self._run("ping", what)  # says "the data is gone" if that is why the group vanished
            self._ensure_group(stream, force=True)
        raise AssertionError("unreachable")

    def _archive(self, event: str, rows: builtins.list[dict[str, Any]]) -> None:
        if self.archive is not None:
            self.archive.append(event, rows)

    @staticmethod
    def _event(event: str, row: dict[str, Any]) -> bytes:
        return _json.dumps({"event": event, "at": time.time(), **row})

    # --- DeadLetterStore -------------------------------------------------------------------

    def put(self, entries: Sequence[DeadLetter]) -> int:
        """Upsert entries in one atomic script; returns how many ids were new."""
        if not entries:
            return 0
        args: builtins.list[Any] = [self.events_maxlen]
        for e in entries:
            _check_id(e.id)
            payload, failed, codec = _encode_json(e.payload, e.failed_expectations)
            args += [
                e.id, e.source, e.url, e.stage, e.error_class, e.message, int(e.attempts),
                _float(e.first_seen, "first_seen", e.id), _float(e.last_seen, "last_seen", e.id),
                e.record_key, payload, failed, e.flow_run_id or "",
                "1" if e.flow_run_id is not None else "0", e.status, e.resolution or "",
                "1" if e.resolution is not None else "0", codec,
                self._event("quarantined", e.to_dict()), e.cause, e.resolution_kind or "",
                e.trace_id, e.url_digest, e.span_id,
            ]  # fmt: skip
        new = int(self._run("put", "put failed", *args))
        self._archive("quarantined", [e.to_dict() for e in entries])
        return new

    def get(self, entry_id: str) -> DeadLetter | None:
        if not _usable_id(entry_id):
            return None
        flat = self._run("get", "get failed", entry_id)
        return _from_hash(_pairs(flat)) if flat else None

    def list(
        self,
        *,
        source: str | None = None,
        stage: str | None = None,
        error_class: str | None = None,
        status: str | None = "open",
        limit: int = 100,
        first_seen_before: float | None = None,
    ) -> builtins.list[DeadLetter]:
        """Newest ``last_seen`` first, like the SQLite store; reads indexes, not every entry.

        ``first_seen_before`` is applied here, after the script (no index on first_seen: the
        age filter is an operator's query, not a hot path).
        """
        args: builtins.list[Any] = [-1 if first_seen_before is not None else int(limit)]
        for value in (source, stage, error_class, status):
            args += ["0", ""] if value is None else ["1", value]
        args.append(_CANDIDATES_MAX)
        found = self._run("list", "list failed", *args)
        entries = [_from_hash(_pairs(flat)) for flat in found if flat]
        if first_seen_before is not None:
            entries = [e for e in entries if e.first_seen < first_seen_before][: max(limit, 0)]
        return entries

    def counts(self, source: str | None = None) -> dict[str, int]:
        args = ["0", ""] if source is None else ["1", source]
        values = self._run("counts", "counts failed", *args)
        return {status: int(n) for status, n in zip(_STATUSES, values, strict=True)}

    def reasons(self, source: str, *, status: str | None = "open") -> dict[str, int]:
        """Entries per ``stage/error_class``, most frequent first."""
        statuses = _STATUSES if status is None else (status,)
        total: dict[str, int] = {}
        for flat in self._run("reasons", "reasons failed", source, *statuses):
            for reason, n in _pairs(flat).items():
                if int(n) > 0:
                    total[reason] = total.get(reason, 0) + int(n)
        return dict(sorted(total.items(), key=lambda item: (-item[1], item[0])))

    def census(self, source: str) -> Census:
        found = self._run("census", "census failed", source)
        ids = [_text(x) for x in found[0::3]]
        rows = [(_text(st), _text(k), 1) for st, k in zip(found[1::3], found[2::3], strict=True)]
        return Census(counts=count_status_kinds(rows), ids=frozenset(ids))

    def resolve(
        self, entry_id: str, kind: ResolutionKind, detail: str, *, requeued: bool = False
    ) -> bool:
        """Resolve an entry that is not resolved yet (open or in review); True exactly once."""
        check_kind(kind)
        if not _usable_id(entry_id):
            return False
        row = {"id": entry_id, "kind": kind, "resolution": detail}
        data = self._event("resolved", row)
        done = bool(self._run("resolve", "resolve failed", self.events_maxlen, entry_id,
                              kind, detail, data, "1" if requeued else "0"))  # fmt: skip
        if done:
            self._archive("resolved", [row])
        return done

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # --- triage claims -------------------------------------------------------------------

    def claim_for_triage(self, entry_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        """Take an open entry for triage until ``now + lease_s`` (one atomic script)."""
        if not owner:
            raise ValueError("owner must be a non-empty name")
        if not _usable_id(entry_id):
            return False
        expires = _float(now + lease_s, "claim expiry", entry_id)
        now_s = _float(now, "now", entry_id)
        return bool(self._run("claim", "claim failed", entry_id, owner, now_s, expires))

    def release_claim(self, entry_id: str, owner: str) -> bool:
        if not _usable_id(entry_id):
            return False
        return bool(self._run("release", "release failed", entry_id, owner))

    # --- manual review queue -------------------------------------------------------------

    def escalate(self, entry_id: str, reason: str) -> bool:
        """Move an open entry to manual review (status ``review``); True exactly once."""
        if not _usable_id(entry_id):
            return False
        row = {"id": entry_id, "reason": reason}
        data = self._event("escalated", row)
        msg = self._run("escalate", "escalate failed", self.events_maxlen, entry_id, reason, data)
        if not msg:
            return False
        self._archive("escalated", [{**row, "review_message": _text(msg)}])
        return True

    def take_for_review(
        self, source: str, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Up to ``count`` escalated entries of ``source`` no other reviewer holds, as
        (message id, entry).

        The consumer group gives each message to one reviewer only; it stays pending under
        that reviewer until :meth:`finish_review` (or until another one claims it with
        :meth:`claim_stale_reviews`). ``block_ms`` waits that long for work when there is none;
        0 returns at once (unlike Redis, where ``BLOCK 0`` waits forever).
        """
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if count < 1:
            return []
        deadline = time.monotonic() + max(block_ms, 0) / 1000
        socket_timeout = self._client.connection_pool.connection_kwargs.get("socket_timeout")
        slice_ms = int(socket_timeout * 500) if socket_timeout else None  # half the timeout
        stream = self.review_key(source)
        taken: builtins.list[tuple[str, DeadLetter]] = []
        while len(taken) < count:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            block = None
            if remaining_ms > 0:
                block = max(1, min(remaining_ms, slice_ms) if slice_ms else remaining_ms)
            want = count - len(taken)
            response = self._with_group(
                stream,
                "take for review failed",
                partial(
                    self._client.xreadgroup,
                    REVIEW_GROUP,
                    reviewer,
                    {stream: ">"},
                    count=want,
                    block=block,
                ),
            )
            messages = self._messages(response)
            if messages:
                taken += self._load(source, messages, "take for review failed")
            elif block is None:
                break
        return taken

    def claim_stale_reviews(
        self, source: str, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Take over reviews of ``source`` held longer than ``idle_ms`` by someone else."""
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        stream = self.review_key(source)
        claimed: builtins.list[tuple[str, DeadLetter]] = []
        start = "0-0"
        while len(claimed) < count:
            want = count - len(claimed)
            response = self._with_group(
                stream,
                "claim stale reviews failed",
                partial(
                    self._client.xautoclaim,
                    stream,
                    REVIEW_GROUP,
                    reviewer,
                    max(int(idle_ms), 0),
                    start_id=start,
                    count=want,
                ),
            )
            start = _text(response[0])
            pairs = [(m, f) for m, f in response[1] if m is not None and f is not None]
            claimed += self._load(source, pairs, "claim stale reviews failed")
            if start == "0-0":
                break
        return claimed

    def take_entry_for_review(
        self, source: str, entry_id: str, reviewer: str, *, idle_ms: int | None = None
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """The review of one entry, out of turn (``lua/take_entry.lua`` says how the stream
        order of the others is kept); ``[]`` when not in review here or held by another."""
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        if not _usable_id(entry_id):
            return []
        stream = self.review_key(source)
        what = "take entry for review failed"
        idle = -1 if idle_ms is None else max(int(idle_ms), 0)
        args = [self._base, self._epoch, source, entry_id, reviewer, idle]
        got = self._with_group(
            stream,
            what,
            partial(
                self._scripts, "take_entry", [self._meta_key], args, records=self._base + "req:"
            ),
        )
        if not got or _text(got) == "held":
            return []
        return self._load(source, [(got, {"entry": entry_id})], what)

    def put_back(self, message_id: str, entry_id: str) -> bool:
        """Hand a held review back: its message is replaced by a new one at the end of the
        source's stream (a consumer group cannot un-deliver a message), held by nobody."""
        if not _usable_id(entry_id):
            return False
        return bool(self._run("put_back", "put back failed", message_id, entry_id))

    def finish_review(
        self, message_id: str, entry_id: str, kind: ResolutionKind, detail: str
    ) -> bool:
        """Resolve the reviewed entry (once) and acknowledge its message (always).

        False when the entry was already resolved (e.g. by another finish, or by
        :meth:`resolve`), or when this message is no longer the entry's current review.
        ValueError when the message is about another entry.
        """
        check_kind(kind)
        if not _usable_id(entry_id):
            return False
        row = {"id": entry_id, "kind": kind, "resolution": detail, "review_message": message_id}
        data = self._event("resolved", row)
        done = bool(self._run("finish", "finish review failed", self.events_maxlen, message_id,
                              entry_id, kind, detail, data))  # fmt: skip
        if done:
            self._archive("resolved", [row])
        return done

    @staticmethod
    def _messages(response: Any) -> builtins.list[tuple[Any, Any]]:
        """XREADGROUP reply (RESP2 list or RESP3 dict) -> [(message id, fields)]."""
        if not response:
            return []
        streams = response.values() if isinstance(response, dict) else (s[1] for s in response)
        out: builtins.list[tuple[Any, Any]] = []
        for stream in streams:
            messages = stream[0] if stream and isinstance(stream[0], list) else stream
            out += [(m, f) for m, f in messages if m is not None and f is not None]
        return out

    def _load(
        self, source: str, messages: builtins.list[tuple[Any, Any]], what: str
    ) -> builtins.list[tuple[str, DeadLetter]]:
        args: builtins.list[str] = []
        for message_id, fields in messages:
            entry = {_text(k): _text(v) for k, v in fields.items()}.get("entry", "")
            args += [_text(message_id), entry if _usable_id(entry) else "meta"]
        if not args:
            return []
        hashes = self._run("load_reviews", what, source, *args)
        return [(args[2 * i], _from_hash(_pairs(flat))) for i, flat in enumerate(hashes) if flat]
