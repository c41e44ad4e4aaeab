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
    Pix:class:{class}                  SET    ids whose error class is {class} or ends ':{class}'
    Pix:reasons:{status}:{source}      HASH   "stage/error_class" -> number of entries
    Pmeta                              HASH   epoch token: detects that the data vanished
    Pevents                            STREAM every history event (quarantined/escalated/resolved)
    Preview                            STREAM escalated entries, consumer group ``reviewers``

Every operation is one Lua script (one round trip, atomic: no other client can interleave, so the
indexes, the counters and the event stream always agree with the entries). Scripts validate
before their first write, so an error never leaves a half-applied change behind.

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

import orjson
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from collector import defaults
from collector._closing import Closing
from collector.deadletter.base import DeadLetter, count_status_kinds
from collector.deadletter.sqlite import JsonlArchive, _dumps
from collector.errors import BackendError
from collector.ops.scrub import Scrubber

__all__ = ["REVIEW_GROUP", "RedisDeadLetterStore"]

REVIEW_GROUP = "reviewers"
_STATUSES = ("open", "review", "resolved")
_RESERVED_IDS = frozenset({"meta", "events", "review"})  # would collide with the store's keys
_LOST = "DLLOST"  # error prefix raised by the scripts when the epoch token does not match
_MISMATCH = "DLMISMATCH"
_CANDIDATES_MAX = 5000  # list(): below this size, read the smallest filter set instead of scanning

# --- Lua -------------------------------------------------------------------------------------
# Shared by every script: ARGV[1] is the key prefix "{prefix}:dl:", ARGV[2] the epoch token,
# KEYS[1] the meta key. The epoch check runs before any write.
_PRELUDE = """
local P = ARGV[1]
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then
  return redis.error_reply('DLLOST the dead-letter data this store was using is gone')
end
local function esc(s)
  return (string.gsub(string.gsub(s, '%%', '%%25'), ':', '%%3A'))
end
local function status_add(id, src, stage, cls, st)
  redis.call('SADD', P .. 'ix:status:' .. esc(st), id)
  redis.call('SADD', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  redis.call('HINCRBY', P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src), stage .. '/' .. cls, 1)
end
local function status_rem(id, src, stage, cls, st)
  redis.call('SREM', P .. 'ix:status:' .. esc(st), id)
  redis.call('SREM', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  local rk = P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src)
  local field = stage .. '/' .. cls
  if redis.call('HINCRBY', rk, field, -1) <= 0 then redis.call('HDEL', rk, field) end
end
local function move(id, src, stage, cls, from, to)
  status_rem(id, src, stage, cls, from)
  status_add(id, src, stage, cls, to)
end
local function event(maxlen, name, id, data)
  redis.call('XADD', P .. 'events', 'MAXLEN', '~', maxlen, '*',
             'event', name, 'id', id, 'data', data)
end
local function forget_review(key, msg)
  if msg then
    redis.pcall('XACK', P .. 'review', 'reviewers', msg)
    redis.call('XDEL', P .. 'review', msg)
  end
  redis.call('HDEL', key, 'review_msg', 'review_reason')
end
"""

# ARGV[3] events maxlen, then 19 values per entry in the order put() sends them.
# Returns how many ids were new.
_PUT = """
local new = 0
for i = 4, #ARGV, 19 do
  local id = ARGV[i]
  local key = P .. id
  local last = ARGV[i + 8]
  local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'attempts')
  local src = cur[1]
  if not src then
    new = new + 1
    src = ARGV[i + 1]
    local stage, cls, st = ARGV[i + 3], ARGV[i + 4], ARGV[i + 14]
    redis.call('HSET', key, 'id', id, 'source', src, 'url', ARGV[i + 2], 'stage', stage,
               'error_class', cls, 'message', ARGV[i + 5], 'attempts', ARGV[i + 6],
               'first_seen', ARGV[i + 7], 'last_seen', last, 'record_key', ARGV[i + 9],
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17], 'status', st)
    if ARGV[i + 13] == '1' then redis.call('HSET', key, 'flow_run_id', ARGV[i + 12]) end
    if ARGV[i + 16] == '1' then redis.call('HSET', key, 'resolution', ARGV[i + 15]) end
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage), id)
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage) .. ':' .. esc(src), id)
    redis.call('SADD', P .. 'ix:class:' .. esc(cls), id)
    local pos = 1
    while true do  -- every ':'-suffix, so 'a:b:http_500' matches 'http_500' and 'b:http_500'
      local c = string.find(cls, ':', pos, true)
      if not c then break end
      redis.call('SADD', P .. 'ix:class:' .. esc(string.sub(cls, c + 1)), id)
      pos = c + 1
    end
    status_add(id, src, stage, cls, st)
  else
    local attempts = ARGV[i + 6]
    if tonumber(cur[5]) > tonumber(attempts) then attempts = cur[5] end
    redis.call('HSET', key, 'message', ARGV[i + 5], 'attempts', attempts, 'last_seen', last,
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17])
    if ARGV[i + 13] == '1' then
      redis.call('HSET', key, 'flow_run_id', ARGV[i + 12])
    else
      redis.call('HDEL', key, 'flow_run_id')
    end
    if cur[4] == 'resolved' then  -- seen again after its resolution: open again
      redis.call('HSET', key, 'status', 'open')
      redis.call('HDEL', key, 'resolution', 'claimed_by', 'claim_expires')
      move(id, src, cur[2], cur[3], 'resolved', 'open')
    end
  end
  redis.call('ZADD', P .. 'ix:seen', last, id)
  redis.call('ZADD', P .. 'ix:seen:' .. esc(src), last, id)
  event(ARGV[3], 'quarantined', id, ARGV[i + 18])
end
return new
"""

# ARGV[3] id. Returns the entry hash (empty when missing).
_GET = """
return redis.call('HGETALL', P .. ARGV[3])
"""

# ARGV[3] limit (<0: no limit), then flag/value pairs: source, stage, error_class, status.
_LIST = """
local limit = tonumber(ARGV[3])
if limit == 0 then return {} end
local has_src, src = ARGV[4] == '1', ARGV[5]
local order = P .. 'ix:seen'
local tail = ''
if has_src then
  order = order .. ':' .. esc(src)
  tail = ':' .. esc(src)
end
local filters = {}
if ARGV[10] == '1' then table.insert(filters, P .. 'ix:status:' .. esc(ARGV[11]) .. tail) end
if ARGV[6] == '1' then table.insert(filters, P .. 'ix:stage:' .. esc(ARGV[7]) .. tail) end
if ARGV[8] == '1' then table.insert(filters, P .. 'ix:class:' .. esc(ARGV[9])) end

local function chunked(cmd, key, list)  -- cmd over list in slices (unpack has a stack limit)
  local out = {}
  for a = 1, #list, 500 do
    local b = math.min(a + 499, #list)
    local part = redis.call(cmd, key, unpack(list, a, b))
    for j = 1, #part do out[a + j - 1] = part[j] end
  end
  return out
end

local ids = {}
if #filters == 0 then
  ids = redis.call('ZREVRANGE', order, 0, limit < 0 and -1 or limit - 1)
else
  local smallest, size = nil, nil
  for _, k in ipairs(filters) do
    local n = redis.call('SCARD', k)
    if size == nil or n < size then smallest, size = k, n end
  end
  if size == 0 then return {} end
  if size <= tonumber(ARGV[12]) then
    -- few candidates: take the smallest set, keep what the others and the order zset hold
    local members = redis.call('SMEMBERS', smallest)
    local scores = chunked('ZMSCORE', order, members)
    local ok = {}
    for j = 1, #members do ok[j] = scores[j] ~= false end
    for _, k in ipairs(filters) do
      if k ~= smallest then
        local flags = chunked('SMISMEMBER', k, members)
        for j = 1, #members do if flags[j] == 0 then ok[j] = false end end
      end
    end
    local found = {}
    for j = 1, #members do
      if ok[j] then table.insert(found, {tonumber(scores[j]), members[j]}) end
    end
    table.sort(found, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      return x[2] > y[2]
    end)
    for j = 1, #found do
      if limit >= 0 and j > limit then break end
      ids[j] = found[j][2]
    end
  else
    -- many candidates everywhere: walk the order zset from the newest, keep the matches
    local step = math.min(1000, math.max(200, 2 * limit))
    local start, full = 0, false
    while not full do
      local chunk = redis.call('ZREVRANGE', order, start, start + step - 1)
      if #chunk == 0 then break end
      local ok = {}
      for j = 1, #chunk do ok[j] = true end
      for _, k in ipairs(filters) do
        local flags = redis.call('SMISMEMBER', k, unpack(chunk))
        for j = 1, #chunk do if flags[j] == 0 then ok[j] = false end end
      end
      for j = 1, #chunk do
        if ok[j] then
          table.insert(ids, chunk[j])
          if limit >= 0 and #ids >= limit then full = true break end
        end
      end
      start = start + step
    end
  end
end
local out = {}
for j = 1, #ids do out[j] = redis.call('HGETALL', P .. ids[j]) end
return out
"""

# ARGV[3] '1' with a source, ARGV[4] the source. Returns open, review, resolved counts.
_COUNTS = """
local tail = ''
if ARGV[3] == '1' then tail = ':' .. esc(ARGV[4]) end
return {redis.call('SCARD', P .. 'ix:status:open' .. tail),
        redis.call('SCARD', P .. 'ix:status:review' .. tail),
        redis.call('SCARD', P .. 'ix:status:resolved' .. tail)}
"""

# ARGV[3] source. Returns {open count, review count, prefix, n, prefix, n...}: resolved entries
# by the text before the first ':' of their resolution. O(resolved entries of the source) inside
# Redis, one round trip, no payload leaves the server.
_STATUS_KINDS = """
local src = esc(ARGV[3])
local out = {redis.call('SCARD', P .. 'ix:status:open:' .. src),
             redis.call('SCARD', P .. 'ix:status:review:' .. src)}
local kinds = {}
for _, id in ipairs(redis.call('SMEMBERS', P .. 'ix:status:resolved:' .. src)) do
  local resolution = redis.call('HGET', P .. id, 'resolution') or ''
  local kind = string.match(resolution, '^([^:]*)')
  kinds[kind] = (kinds[kind] or 0) + 1
end
for kind, n in pairs(kinds) do
  table.insert(out, kind)
  table.insert(out, n)
end
return out
"""

# ARGV[3] source, then the statuses to read. Returns one flat HGETALL per status.
_REASONS = """
local out = {}
for i = 4, #ARGV do
  out[#out + 1] = redis.call('HGETALL', P .. 'ix:reasons:' .. esc(ARGV[i]) .. ':' .. esc(ARGV[3]))
end
return out
"""

# ARGV[3] maxlen, ARGV[4] id, ARGV[5] resolution, ARGV[6] event data, ARGV[7] '1' when the
# item was requeued (the entry's requeues count grows). Returns 1 if resolved now.
_RESOLVE = """
local key = P .. ARGV[4]
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'review_msg')
if not cur[1] or cur[4] == 'resolved' then return 0 end
redis.call('HSET', key, 'status', 'resolved', 'resolution', ARGV[5])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
if ARGV[7] == '1' then redis.call('HINCRBY', key, 'requeues', 1) end
move(ARGV[4], cur[1], cur[2], cur[3], cur[4], 'resolved')
forget_review(key, cur[5])  -- a pending review of it is moot: nobody should get it any more
event(ARGV[3], 'resolved', ARGV[4], ARGV[6])
return 1
"""

# ARGV[3] maxlen, ARGV[4] id, ARGV[5] reason, ARGV[6] event data (without the message id).
# Returns the review message id, or false if the entry is not open.
_ESCALATE = """
local key = P .. ARGV[4]
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status')
if not cur[1] or cur[4] ~= 'open' then return false end
local msg = redis.call('XADD', P .. 'review', '*', 'entry', ARGV[4], 'reason', ARGV[5])
redis.call('HSET', key, 'status', 'review', 'review_msg', msg, 'review_reason', ARGV[5])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
move(ARGV[4], cur[1], cur[2], cur[3], 'open', 'review')
event(ARGV[3], 'escalated', ARGV[4], ARGV[6])
return msg
"""

# ARGV[3] maxlen, ARGV[4] message id, ARGV[5] entry id, ARGV[6] resolution, ARGV[7] event data.
# Acks the message whatever happens; returns 1 if this call resolved the entry.
_FINISH = """
local msg, id = ARGV[4], ARGV[5]
local found = redis.call('XRANGE', P .. 'review', msg, msg)
if #found > 0 then
  local fields, entry = found[1][2], nil
  for j = 1, #fields, 2 do if fields[j] == 'entry' then entry = fields[j + 1] end end
  if entry ~= id then
    return redis.error_reply('DLMISMATCH review message ' .. msg .. ' is for entry '
                             .. tostring(entry) .. ', not ' .. id)
  end
end
local key = P .. id
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'review_msg')
redis.pcall('XACK', P .. 'review', 'reviewers', msg)
redis.call('XDEL', P .. 'review', msg)
if not cur[1] or cur[4] ~= 'review' or cur[5] ~= msg then return 0 end
redis.call('HSET', key, 'status', 'resolved', 'resolution', ARGV[6])
redis.call('HDEL', key, 'review_msg', 'review_reason')
move(id, cur[1], cur[2], cur[3], 'review', 'resolved')
event(ARGV[3], 'resolved', id, ARGV[7])
return 1
"""

# ARGV[3..] message id / entry id pairs just delivered to a reviewer. Returns one hash per pair,
# empty for messages that are moot (entry gone, no longer in review, or re-escalated since):
# those are acked and deleted so that nobody gets them again.
_LOAD_REVIEWS = """
local out = {}
for i = 3, #ARGV, 2 do
  local msg, id = ARGV[i], ARGV[i + 1]
  local key = P .. id
  local cur = redis.call('HMGET', key, 'status', 'review_msg')
  if cur[1] == 'review' and cur[2] == msg then
    out[#out + 1] = redis.call('HGETALL', key)
  else
    redis.pcall('XACK', P .. 'review', 'reviewers', msg)
    redis.call('XDEL', P .. 'review', msg)
    out[#out + 1] = {}
  end
end
return out
"""

# ARGV[3] id, ARGV[4] owner, ARGV[5] now, ARGV[6] expiry. Returns 1 if the claim is taken.
_CLAIM = """
local key = P .. ARGV[3]
local cur = redis.call('HMGET', key, 'status', 'claimed_by', 'claim_expires')
if cur[1] ~= 'open' then return 0 end
if cur[2] and cur[2] ~= ARGV[4] and tonumber(cur[3]) > tonumber(ARGV[5]) then return 0 end
redis.call('HSET', key, 'claimed_by', ARGV[4], 'claim_expires', ARGV[6])
return 1
"""

# ARGV[3] id, ARGV[4] owner. Returns 1 if the owner's claim was dropped.
_RELEASE = """
local key = P .. ARGV[3]
if redis.call('HGET', key, 'claimed_by') ~= ARGV[4] then return 0 end
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
return 1
"""

_PING = "return 1"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _encode_json(payload: Any, failed: Any) -> tuple[bytes, bytes, str]:
    """orjson for both, or stdlib json for both when orjson refuses one of them.

    The codec is stored with the entry because orjson would read back a >64-bit integer written
    by the fallback as a float; stdlib json reads it back exactly.
    """
    try:
        return orjson.dumps(payload, default=str), orjson.dumps(failed, default=str), "orjson"
    except orjson.JSONEncodeError:
        return _dumps(payload), _dumps(failed), "json"


def _decode_json(raw: str, codec: str) -> Any:
    if codec == "json":
        import json

        return json.loads(raw)
    return orjson.loads(raw)


def _from_hash(h: dict[str, str]) -> DeadLetter:
    codec = h.get("codec", "orjson")
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
        payload=_decode_json(h["payload"], codec),
        failed_expectations=_decode_json(h["failed_expectations"], codec),
        flow_run_id=h.get("flow_run_id"),
        status=h["status"],  # type: ignore[arg-type]  # stored from a Status
        resolution=h.get("resolution"),
        requeues=int(h.get("requeues", 0)),
    )


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


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class RedisDeadLetterStore(Closing):
    """Dead letters in Redis, shared by every worker that uses the same URL and prefix.

    ``url_or_client`` is a ``redis://`` URL (the store then owns its client: no automatic
    retries, because a retried script whose reply was lost would count and log twice; stale
    pooled connections are still re-opened transparently) or a ready ``redis.Redis`` client
    (used as it is, never closed by the store). ``archive`` adds the local append-only JSONL
    history of the SQLite store; the ``{prefix}:dl:events`` stream is the shared one, trimmed to
    about ``events_maxlen`` events.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "collector",
        archive: str | Path | None = None,
        events_maxlen: int = 1_000_000,
        socket_timeout: float | None = 10.0,
        archive_max_bytes: int = defaults.DEADLETTER_ARCHIVE_BYTES,
    ) -> None:
        if events_maxlen < 1:
            raise ValueError("events_maxlen must be at least 1")
        self.prefix = prefix
        self.events_maxlen = events_maxlen
        self._owns_client = isinstance(url_or_client, str)
        if isinstance(url_or_client, str):
            self.url = Scrubber().url(url_or_client)
            try:
                self._client = redis.Redis.from_url(
                    url_or_client,
                    socket_timeout=socket_timeout,
                    socket_connect_timeout=min(socket_timeout or 5.0, 5.0),
                    retry=Retry(NoBackoff(), 0),
                )
            except (ValueError, redis.RedisError) as exc:
                raise BackendError(f"dead letters {self.url}: {_one_line(exc)}") from exc
        else:
            self._client = url_or_client
            self.url = self._describe(url_or_client)
        self._base = f"{prefix}:dl:"
        self.events_key = self._base + "events"
        self.review_key = self._base + "review"
        self._meta_key = self._base + "meta"
        self.archive = JsonlArchive(archive, max_bytes=archive_max_bytes) if archive else None
        self._scripts = {
            name: self._client.register_script(_PRELUDE + body)
            for name, body in (
                ("put", _PUT),
                ("get", _GET),
                ("list", _LIST),
                ("counts", _COUNTS),
                ("reasons", _REASONS),
                ("status_kinds", _STATUS_KINDS),
                ("resolve", _RESOLVE),
                ("escalate", _ESCALATE),
                ("finish", _FINISH),
                ("load_reviews", _LOAD_REVIEWS),
                ("claim", _CLAIM),
                ("release", _RELEASE),
                ("ping", _PING),
            )
        }
        self._lock = threading.Lock()
        self._group_ready = False
        self._epoch = ""
        try:
            with self._errors("cannot connect"):
                self._client.ping()
                self._adopt_epoch()
        except BackendError:
            self.close()
            raise

    # --- plumbing ------------------------------------------------------------------------

    @staticmethod
    def _describe(client: redis.Redis) -> str:
        """Where a passed-in client points, without its password."""
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/" + str(
            kwargs.get("db", 0)
        )

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
            self._group_ready = False

    def _fail(self, what: str, exc: BaseException) -> NoReturn:
        raise BackendError(f"dead letters {self.url}: {what}: {_one_line(exc)}") from exc

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
            return self._scripts[name](keys=[self._meta_key], args=[self._base, self._epoch, *args])

    def _ensure_group(self, *, force: bool = False) -> None:
        """Create the reviewers group once (from the stream's start, so nothing is skipped)."""
        if self._group_ready and not force:
            return
        with self._errors("cannot create the review group"):
            try:
                self._client.xgroup_create(self.review_key, REVIEW_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    def _with_group(self, what: str, call: Callable[[], Any]) -> Any:
        """Run a consumer-group command, re-creating the group once if the server lost it."""
        self._ensure_group()
        for attempt in (1, 2):
            with self._errors(what):
                try:
                    return call()
                except redis.ResponseError as exc:
                    if "NOGROUP" not in str(exc) or attempt == 2:
                        raise
            self._run("ping", what)  # says "the data is gone" if that is why the group vanished
            self._ensure_group(force=True)
        raise AssertionError("unreachable")

    def _archive(self, event: str, rows: builtins.list[dict[str, Any]]) -> None:
        if self.archive is not None:
            self.archive.append(event, rows)

    @staticmethod
    def _event(event: str, row: dict[str, Any]) -> bytes:
        return _dumps({"event": event, "at": time.time(), **row})

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
                self._event("quarantined", e.to_dict()),
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

    def status_kinds(self, source: str) -> dict[str, int]:
        found = self._run("status_kinds", "status counts failed", source)
        rows = [("open", "", found[0]), ("review", "", found[1])]
        rows += [("resolved", _text(k), n) for k, n in zip(found[2::2], found[3::2], strict=True)]
        return count_status_kinds(rows)

    def resolve(self, entry_id: str, resolution: str, *, requeued: bool = False) -> bool:
        """Resolve an entry that is not resolved yet (open or in review); True exactly once."""
        if not _usable_id(entry_id):
            return False
        row = {"id": entry_id, "resolution": resolution}
        data = self._event("resolved", row)
        done = bool(self._run("resolve", "resolve failed", self.events_maxlen, entry_id,
                              resolution, data, "1" if requeued else "0"))  # fmt: skip
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
        self, reviewer: str, *, count: int = 1, block_ms: int = 0
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Up to ``count`` escalated entries no other reviewer holds, as (message id, entry).

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
        taken: builtins.list[tuple[str, DeadLetter]] = []
        while len(taken) < count:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            block = None
            if remaining_ms > 0:
                block = max(1, min(remaining_ms, slice_ms) if slice_ms else remaining_ms)
            want = count - len(taken)
            response = self._with_group(
                "take for review failed",
                partial(
                    self._client.xreadgroup,
                    REVIEW_GROUP,
                    reviewer,
                    {self.review_key: ">"},
                    count=want,
                    block=block,
                ),
            )
            messages = self._messages(response)
            if messages:
                taken += self._load(messages, "take for review failed")
            elif block is None:
                break
        return taken

    def claim_stale_reviews(
        self, reviewer: str, *, idle_ms: int, count: int = 100
    ) -> builtins.list[tuple[str, DeadLetter]]:
        """Take over reviews held longer than ``idle_ms`` by someone else (who vanished)."""
        if not reviewer:
            raise ValueError("reviewer must be a non-empty name")
        claimed: builtins.list[tuple[str, DeadLetter]] = []
        start = "0-0"
        while len(claimed) < count:
            want = count - len(claimed)
            response = self._with_group(
                "claim stale reviews failed",
                partial(
                    self._client.xautoclaim,
                    self.review_key,
                    REVIEW_GROUP,
                    reviewer,
                    max(int(idle_ms), 0),
                    start_id=start,
                    count=want,
                ),
            )
            start = _text(response[0])
            pairs = [(m, f) for m, f in response[1] if m is not None and f is not None]
            claimed += self._load(pairs, "claim stale reviews failed")
            if start == "0-0":
                break
        return claimed

    def finish_review(self, message_id: str, entry_id: str, resolution: str) -> bool:
        """Resolve the reviewed entry (once) and acknowledge its message (always).

        False when the entry was already resolved (e.g. by another finish, or by
        :meth:`resolve`), or when this message is no longer the entry's current review.
        ValueError when the message is about another entry.
        """
        row = {"id": entry_id, "resolution": resolution, "review_message": message_id}
        data = self._event("resolved", row)
        self._ensure_group()
        done = bool(self._run("finish", "finish review failed", self.events_maxlen, message_id,
                              entry_id, resolution, data))  # fmt: skip
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
        self, messages: builtins.list[tuple[Any, Any]], what: str
    ) -> builtins.list[tuple[str, DeadLetter]]:
        args: builtins.list[str] = []
        for message_id, fields in messages:
            entry = {_text(k): _text(v) for k, v in fields.items()}.get("entry", "")
            args += [_text(message_id), entry if _usable_id(entry) else "meta"]
        if not args:
            return []
        hashes = self._run("load_reviews", what, *args)
        return [(args[2 * i], _from_hash(_pairs(flat))) for i, flat in enumerate(hashes) if flat]
