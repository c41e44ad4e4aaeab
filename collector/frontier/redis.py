"""Redis frontier: the shared backend for workers on several machines.

It behaves exactly like :class:`collector.frontier.sqlite.SqliteFrontier`: the conformance suite
is the contract, and a differential test replays random call sequences against both and compares
every result. Only the storage differs. Every state change runs in one Lua script, so it is
atomic and serialised with every other client's changes, and no script reads Redis' clock: every
time is the caller's ``now``, sent and returned as text that reads back as the same double.

Keys
----
All keys of a source share the Cluster hash tag ``{PREFIX:SOURCE}`` (written ``B`` below), so
a source lives in one slot. Where an item *is* (which sorted set) says what the claim needs;
a compact record holds the rest::

    B:r:HHHH   hash   records. 16 bits of sha1(url) pick one of <= 65,536 buckets; the field is
                      the next 84 bits (12 bytes), the value a msgpack array/map of the item's
                      fields, zero and empty ones omitted. Buckets stay small enough for Redis'
                      listpack encoding (~45 bytes an item, against ~170 for a hash per item).
    B:q        zset   queued items that are due: member url, score -rank (so equal ranks come
                      out in url order, as from SQLite's index); while an item is here its rank
                      is only this score
    B:d        zset   queued items whose not_before had not come when they were queued, score
                      not_before; moved to B:q by the first claim whose now reaches them
    B:p        zset   items in B:q that have a not_before, score not_before: only so that
                      next_event_at reports the earliest not_before exactly as SQLite does
    B:l        zset   leased items, score lease_expires (reclaim = score <= now)
    B:xb       zset   expiry buckets, member and score an expires_at
    B:x:T      list   urls that entered the queue with expires_at T. Lazy: an item that left the
                      queue keeps its entry, and the claim that drains the bucket checks each
                      record, so a list entry (~34 bytes) replaces a zset entry (~140 bytes) per
                      queued item; stale entries live until their bucket's time
    B:n        hash   state -> count, so counts() is O(1)
    B:runs     hash   run_id -> small run number (kept in each record)
    B:rc:N     hash   state -> count of the items last offered by run N, moved on every
                      transition, so run_counts() is O(1) (one small hash per run, never deleted)
    B:err      hash   url -> last_error of items that have one (an expired item's
                      ``queue_ttl_expired`` is implied by its state)
    PREFIX:fencing_token  string, INCR by every claim

Records are found by a 100-bit digest of the URL, not by the URL, because one copy of the URL
(in the sorted set that holds a live item) is all the memory target allows: 1M queued URLs take
~225 MB, ~225 bytes a URL. Two URLs with the same digest would share a record; for 10^9 URLs the
chance is ~4 x 10^-13, which we accept.

The fencing token is store-wide because tokens must grow across sources, so the claim script
touches a second slot: fine on one Redis or behind Sentinel, refused (CROSSSLOT) by a Redis
Cluster, where tokens would have to live per source (monotonic per source only).

Round trips
-----------
claim, ack, renew, release, requeue, counts, run_counts and next_event_at are one EVALSHA each;
an ack carries its outcomes and a claim returns its items as one JSON string (cheaper on both
sides than thousands of arguments). offer is two per chunk of 500 URLs, because the rank of a
stale URL depends on its last fetch and is computed in Python by the planner's ``rank_for``: a
read script returns each URL's state, freshness and record version (sha1 of the record), Python
applies :func:`~collector.frontier.base.plan_decision` and ``rank_for``, and an apply script
writes each decision only if the URL's record is still that version (optimistic concurrency; a
script cannot interleave, so the check and the write are one step). URLs whose record changed in
between (another worker claimed or offered them) are read and decided again, so the outcome is
that of a serialised offer. Each URL is applied atomically, a chunk need not be: decisions are
independent per URL.

Costs and limits
----------------
A claim that finds many items past their queue TTL expires them all in that one script (as
SQLite does in one transaction), blocking Redis for a few microseconds per item. Redis without
persistence loses the queue *and* the fencing counter on restart, so tokens would start again at
1: each RedisFrontier remembers the highest token it was given and refuses (BackendError) a claim
whose token is not above one handed out before that claim began. Run Redis with ``appendonly
yes`` for a frontier you care about.

Errors from redis-py become :class:`~collector.errors.BackendError` with one line naming the
frontier (password removed) and the step. Clients this class creates do not retry by themselves:
a script whose reply was lost may have run, and replaying an ack would report its items stale.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import RedisError
from redis.retry import Retry

from collector._closing import Closing
from collector.errors import BackendError
from collector.frontier.base import (
    STATES,
    AckResult,
    ClaimedItem,
    Completed,
    DeadLettered,
    Lease,
    Offer,
    OfferResult,
    Outcome,
    RankFor,
    RetryLater,
    StateCounts,
    StoredRow,
    plan_decision,
)

__all__ = ["RedisFrontier"]

_CHUNK = 500  # URLs per offer script: bounded script run time, few round trips
_MAX_OFFER_ROUNDS = 100  # re-decisions of one chunk under contention before giving up

# --- Lua ------------------------------------------------------------------------------------
# Shared by every script: key names, record access, counters, queue and expiry indexes.
# Record fields: 1 state, 2 run, 3 rank (false while the item's B:q score holds it), 4 enqueued_at,
# 5 expires_at, 6 not_before, 7 attempts, 8 first_attempt_at, 9 lease_token, 10 fresh_until,
# 11 last_fetched_at, 12 cost, 13 has a last_error in B:err. Absent fields are nil (zero), so they
# take no space.
_PRELUDE = """
local B = KEYS[1]
local K_Q, K_D, K_P, K_L = B .. ':q', B .. ':d', B .. ':p', B .. ':l'
local K_XB, K_N, K_RUNS, K_ERR = B .. ':xb', B .. ':n', B .. ':runs', B .. ':err'
local Q, L, D, X, E = 1, 2, 3, 4, 5

-- exact text of a double (Redis turns Lua numbers into text with only 14 digits)
local function fmt(x) return string.format('%.17g', x) end
local function nz(x) if x == 0 then return nil end return x end
-- fmt remembered: the items of one offer share their times, and formatting is the costly part
local fmt_seen = {}
local function cfmt(x)
  if x ~= x then return fmt(x) end  -- NaN cannot be a table key
  local s = fmt_seen[x]
  if not s then s = fmt(x); fmt_seen[x] = s end
  return s
end

local function loc(url)
  local h = redis.sha1hex(url)
  -- 52 + 32 bits of the digest as a double and an int: 12 bytes, and the cheapest Lua we found
  return B .. ':r:' .. string.sub(h, 1, 4),
    struct.pack('>dI4', tonumber(string.sub(h, 5, 17), 16), tonumber(string.sub(h, 18, 25), 16))
end
local function load(url)
  local k, f = loc(url)
  local raw = redis.call('HGET', k, f)
  if raw then return cmsgpack.unpack(raw), k, f, raw end
  return nil, k, f, nil
end
local function save(k, f, rec) redis.call('HSET', k, f, cmsgpack.pack(rec)) end
-- last_error lives in B:err; field 13 of the record says there is one to clear
local function set_error(url, rec, text) redis.call('HSET', K_ERR, url, text); rec[13] = 1 end
local function clear_error(url, rec)
  if rec[13] then redis.call('HDEL', K_ERR, url); rec[13] = nil end
end

-- many-argument calls, in slices small enough for unpack()
local function bulk(cmd, key, args, step)
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

-- counter deltas per run and state, written once at the end of the script
local delta = {}
local function bump(run, state, n)
  local d = delta[run]
  if not d then d = {}; delta[run] = d end
  d[state] = (d[state] or 0) + n
end
local function move(rec, to)
  bump(rec[2], rec[1], -1); bump(rec[2], to, 1); rec[1] = to
end
local function flush_counts()
  local total = {}
  for run, d in pairs(delta) do
    for state, n in pairs(d) do
      if n ~= 0 then
        redis.call('HINCRBY', B .. ':rc:' .. run, state, n)
        total[state] = (total[state] or 0) + n
      end
    end
  end
  for state, n in pairs(total) do
    if n ~= 0 then redis.call('HINCRBY', K_N, state, n) end
  end
  delta = {}
end

-- every time an item enters the queue it gets an entry in the bucket of its expires_at
local pushes = {}
local function push_expiry(url, exp)
  local name = fmt(exp)
  local p = pushes[name]
  if not p then p = {}; pushes[name] = p end
  p[#p + 1] = url
end
local function flush_expiry()
  for name, urls in pairs(pushes) do
    redis.call('ZADD', K_XB, name, name)
    bulk('RPUSH', B .. ':x:' .. name, urls, 1000)
  end
  pushes = {}
end

-- put a queued record in its indexes (the caller has set rec[1] = Q and saves it)
local function enter_queue(url, rec, now)
  local nb = rec[6]
  if nb and nb > now then
    redis.call('ZADD', K_D, fmt(nb), url)
  else
    redis.call('ZADD', K_Q, fmt(-rec[3]), url)
    if nb then redis.call('ZADD', K_P, fmt(nb), url) end
  end
  push_expiry(url, rec[5])
end
local function leave_queue(url, rec)
  if rec[6] then redis.call('ZREM', K_D, url); redis.call('ZREM', K_P, url) end
  redis.call('ZREM', K_Q, url)
end
"""

# KEYS: base, token key. ARGV: now, lease_expires, limit.
# Returns token, reclaimed, expired, and a JSON array of url, attempts, first_attempt_at,
# enqueued_at per item (times as exact text), or '' when nothing was leased.
_CLAIM = (
    _PRELUDE
    + """
local now_s, lexp, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = tonumber(now_s)

-- 1. leases that expired go back to the queue
local reclaimed = 0
local due = redis.call('ZRANGEBYSCORE', K_L, '-inf', now_s)
if #due > 0 then bulk('ZREM', K_L, due, 1000) end
for _, url in ipairs(due) do
  local rec, k, f = load(url)
  if rec and rec[1] == L then
    rec[9] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    reclaimed = reclaimed + 1
  end
end
flush_expiry()

-- 2. queued items past their queue TTL expire (entries of items that moved on are skipped)
local expired = 0
local buckets = redis.call('ZRANGEBYSCORE', K_XB, '-inf', now_s)
for _, name in ipairs(buckets) do
  local lk = B .. ':x:' .. name
  local n = redis.call('LLEN', lk)
  for s = 0, n - 1, 5000 do
    for _, url in ipairs(redis.call('LRANGE', lk, s, s + 4999)) do
      local rec, k, f = load(url)
      if rec and rec[1] == Q and rec[5] <= now then
        if not rec[3] then rec[3] = -tonumber(redis.call('ZSCORE', K_Q, url) or '0') end
        leave_queue(url, rec); move(rec, E); clear_error(url, rec); save(k, f, rec)
        expired = expired + 1
      end
    end
  end
  redis.call('DEL', lk)
end
if #buckets > 0 then bulk('ZREM', K_XB, buckets, 1000) end

-- 3. the fencing token
local token = redis.call('INCR', KEYS[2])

-- 4. delayed items whose not_before has come join the ranked queue
local ready = redis.call('ZRANGEBYSCORE', K_D, '-inf', now_s, 'WITHSCORES')
if #ready > 0 then
  local members = {}
  for i = 1, #ready, 2 do
    local url = ready[i]
    local rec = load(url)
    if rec then
      redis.call('ZADD', K_Q, fmt(-rec[3]), url)
      redis.call('ZADD', K_P, ready[i + 1], url)
    end
    members[#members + 1] = url
  end
  bulk('ZREM', K_D, members, 1000)
end

-- 5. lease the best-ranked due items (an item promoted by a claim whose clock ran ahead of
--    this one's may still be in the future: skip it, it stays first in line)
local out = {}
local taken, skip = 0, 0
local leases = {}
while taken < limit do
  local page = redis.call('ZRANGE', K_Q, skip, skip + (limit - taken) - 1, 'WITHSCORES')
  if #page == 0 then break end
  local gone, gone_p = {}, {}
  for p = 1, #page, 2 do
    local url = page[p]
    local rec, k, f = load(url)
    if not rec or rec[1] ~= Q then
      gone[#gone + 1] = url  -- cannot happen; heal the index rather than fail the claim
    elseif rec[6] and rec[6] > now then
      skip = skip + 1
    else
      gone[#gone + 1] = url
      if rec[6] then gone_p[#gone_p + 1] = url end
      rec[3], rec[9] = -tonumber(page[p + 1]), token
      move(rec, L); save(k, f, rec)
      leases[#leases + 1] = lexp; leases[#leases + 1] = url
      out[#out + 1] = url
      out[#out + 1] = rec[7] or 0
      out[#out + 1] = rec[8] and cfmt(rec[8]) or ''
      out[#out + 1] = cfmt(rec[4])
      taken = taken + 1
    end
  end
  if #gone > 0 then bulk('ZREM', K_Q, gone, 1000) end
  if #gone_p > 0 then bulk('ZREM', K_P, gone_p, 1000) end
end
if #leases > 0 then bulk('ZADD', K_L, leases, 1000) end
flush_counts()
return {token, reclaimed, expired, taken > 0 and cjson.encode(out) or ''}
"""
)

# ARGV: token, now, and one JSON array (one argument: cheaper to send and to read than thousands)
# of, per outcome, 'c' url fresh_until fetched_at cost
#                | 'r' url not_before rank attempts first_attempt_at error
#                | 'd' url attempts error      (numbers as text, so they stay exact)
# Returns accepted, then the 1-based positions of stale outcomes.
_ACK = (
    _PRELUDE
    + """
local token, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local A = cjson.decode(ARGV[3])
local i, n, accepted = 1, 0, 0
local out = {0}
local released = {}
while i <= #A do
  local kind, url = A[i], A[i + 1]
  n = n + 1
  local rec, k, f = load(url)
  local held = rec and rec[1] == L and rec[9] == token
  if held then
    rec[9] = nil
    if kind == 'c' then
      rec[10], rec[11], rec[12] = tonumber(A[i + 2]), tonumber(A[i + 3]),
        nz(tonumber(A[i + 4]))
      rec[7], rec[8] = nil, nil
      move(rec, D)
      clear_error(url, rec)
    elseif kind == 'r' then
      local nb = tonumber(A[i + 2])
      rec[6], rec[3] = nz(nb), tonumber(A[i + 3])
      rec[7], rec[8] = nz(tonumber(A[i + 4])), tonumber(A[i + 5])
      rec[5] = math.max(rec[5], nb + (rec[5] - rec[4]))
      set_error(url, rec, A[i + 6])
      move(rec, Q)
      enter_queue(url, rec, now)
    else
      rec[7] = nz(tonumber(A[i + 2]))
      set_error(url, rec, A[i + 3])
      move(rec, X)
    end
    save(k, f, rec)
    released[#released + 1] = url
    accepted = accepted + 1
  else
    out[#out + 1] = n
  end
  if kind == 'c' then i = i + 5 elseif kind == 'r' then i = i + 7 else i = i + 4 end
end
if #released > 0 then bulk('ZREM', K_L, released, 1000) end
flush_expiry()
flush_counts()
out[1] = accepted
return out
"""
)

# ARGV: token, lease_expires, urls of the lease. Returns how many were renewed.
_RENEW = (
    _PRELUDE
    + """
local token = tonumber(ARGV[1])
local renewed = 0
for i = 3, #ARGV do
  local rec = load(ARGV[i])
  if rec and rec[1] == L and rec[9] == token then
    redis.call('ZADD', K_L, ARGV[2], ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
"""
)

# ARGV: token, now, urls of the lease. Returns how many went back to the queue.
_RELEASE = (
    _PRELUDE
    + """
local token, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local released = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and rec[1] == L and rec[9] == token then
    redis.call('ZREM', K_L, url)
    rec[9] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    released = released + 1
  end
end
flush_expiry()
flush_counts()
return released
"""
)

# ARGV: now, expires_at, urls. Returns how many dead or expired items were queued again.
_REQUEUE = (
    _PRELUDE
    + """
local now, exp = tonumber(ARGV[1]), tonumber(ARGV[2])
local requeued = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and (rec[1] == X or rec[1] == E) then
    rec[6], rec[7], rec[8] = nil, nil, nil
    rec[4], rec[5] = now, exp
    clear_error(url, rec)
    move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    requeued = requeued + 1
  end
end
flush_expiry()
flush_counts()
return requeued
"""
)

# ARGV: a JSON array of url, fresh_until, fetched_at, cost per page (numbers as exact text).
# Returns how many dead items became done.
_REVIVE = (
    _PRELUDE
    + """
local A = cjson.decode(ARGV[1])
local revived = 0
for i = 1, #A, 4 do
  local url = A[i]
  local rec, k, f = load(url)
  if rec and rec[1] == X then
    rec[10], rec[11], rec[12] = tonumber(A[i + 1]), tonumber(A[i + 2]), nz(tonumber(A[i + 3]))
    rec[6], rec[7], rec[8] = nil, nil, nil
    clear_error(url, rec)
    move(rec, D); save(k, f, rec)
    revived = revived + 1
  end
end
flush_counts()
return revived
"""
)

# ARGV: urls. Returns how many done items lost their freshness (the next plan queues them).
_MAKE_STALE = (
    _PRELUDE
    + """
local stale = 0
for i = 1, #ARGV do
  local rec, k, f = load(ARGV[i])
  if rec and rec[1] == D then
    rec[10] = nil; save(k, f, rec)
    stale = stale + 1
  end
end
return stale
"""
)

# ARGV: a JSON array of urls. Returns a JSON array of, per url: the sha1 of its record ('' for
# none: the version the apply script checks), state, fresh_until, last_fetched_at (exact text).
_OFFER_READ = (
    _PRELUDE
    + """
local out = {}
for _, url in ipairs(cjson.decode(ARGV[1])) do
  local rec, _, _, raw = load(url)
  if rec then
    out[#out + 1] = redis.sha1hex(raw)
    out[#out + 1] = rec[1]
    out[#out + 1] = rec[10] and fmt(rec[10]) or ''
    out[#out + 1] = rec[11] and fmt(rec[11]) or ''
  else
    out[#out + 1] = ''; out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = ''
  end
end
return cjson.encode(out)
"""
)

# ARGV: now, expires_at, run_id, and a JSON array of, per url: action ('n' enqueue, 'r' requeue,
# 't' tag), url, the version read ('' for none), queue score = -rank ('' for tags). A url whose
# record is no longer the version that was read is left alone; returns the 1-based positions of
# those.
_OFFER_APPLY = (
    _PRELUDE
    + """
local now, exp = tonumber(ARGV[1]), tonumber(ARGV[2])
local run = redis.call('HGET', K_RUNS, ARGV[3])
if run then
  run = tonumber(run)
else
  run = redis.call('HLEN', K_RUNS) + 1
  redis.call('HSET', K_RUNS, ARGV[3], run)
end
local A = cjson.decode(ARGV[4])
local conflicts = {}
local queued = {}
local n = 0
for i = 1, #A, 4 do
  local action, url, seen = A[i], A[i + 1], A[i + 2]
  n = n + 1
  local k, f = loc(url)
  local raw = redis.call('HGET', k, f)
  if (raw and redis.sha1hex(raw) or '') ~= seen then
    conflicts[#conflicts + 1] = n
  elseif action == 'n' then
    bump(run, Q, 1)
    save(k, f, {Q, run, false, now, exp})
    queued[#queued + 1] = A[i + 3]
    queued[#queued + 1] = url
    push_expiry(url, exp)
  else
    local rec = cmsgpack.unpack(raw)
    if action == 'r' then
      bump(rec[2], rec[1], -1); bump(run, Q, 1)
      rec[1], rec[2], rec[3], rec[4], rec[5] = Q, run, false, now, exp
      rec[6], rec[7], rec[8], rec[9] = nil, nil, nil, nil
      clear_error(url, rec)
      save(k, f, rec)
      queued[#queued + 1] = A[i + 3]
      queued[#queued + 1] = url
      push_expiry(url, exp)
    elseif rec[2] ~= run then
      bump(rec[2], rec[1], -1); bump(run, rec[1], 1)
      rec[2] = run
      save(k, f, rec)
    end
  end
end
if #queued > 0 then bulk('ZADD', K_Q, queued, 1000) end
flush_expiry()
flush_counts()
return conflicts
"""
)

# ARGV: run_id or ''. Returns the counter hash (of the source, or of the run) as field/value.
_COUNTS = (
    _PRELUDE
    + """
if ARGV[1] == '' then return redis.call('HGETALL', K_N) end
local run = redis.call('HGET', K_RUNS, ARGV[2])
if not run then return {} end
return redis.call('HGETALL', B .. ':rc:' .. run)
"""
)

# Earliest not_before of a queued item (0 for those without one) or lease expiry, or nil.
_NEXT_EVENT = (
    _PRELUDE
    + """
local best = nil
if redis.call('ZCARD', K_Q) > redis.call('ZCARD', K_P) then best = 0 end
for _, key in ipairs({K_P, K_D, K_L}) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    local v = tonumber(first[2])
    if best == nil or v < best then best = v end
  end
end
if best == nil then return false end
return fmt(best)
"""
)


def _chunks(items: Iterable[Offer], size: int) -> Iterator[list[Offer]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _num(value: float) -> str:
    """A float as text that reads back as the same double (Lua's tonumber, Redis scores)."""
    return repr(float(value))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "redis://[unparsable url]"


def _client_url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


class RedisFrontier(Closing):
    """Frontier in a Redis database, shared by every worker that uses the same URL and prefix.

    ``url_or_client`` is a ``redis://`` / ``rediss://`` / ``unix://`` URL (this object then owns
    the connection pool and :meth:`close` closes it) or an existing ``redis.Redis`` client
    (left open by :meth:`close`). Construction pings the server, so a wrong URL fails here.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        prefix: str = "collector",
        connect_timeout_s: float = 5.0,
        socket_timeout_s: float = 60.0,
    ) -> None:
        self.prefix = prefix
        self._token_key = f"{prefix}:fencing_token"
        if isinstance(url_or_client, str):
            self.url = _safe_url(url_or_client)
            try:
                self._client: redis.Redis = redis.Redis.from_url(
                    url_or_client,
                    socket_connect_timeout=connect_timeout_s,
                    socket_timeout=socket_timeout_s,
                    retry=Retry(NoBackoff(), 0),
                )
            except (ValueError, RedisError) as exc:
                raise BackendError(
                    f"frontier {self.url}: invalid Redis URL: {_one_line(exc)}"
                ) from exc
            self._owns_client = True
        else:
            self._client = url_or_client
            self.url = _client_url(url_or_client)
            self._owns_client = False
        self._scripts: dict[str, Script] = {}
        # The highest token this object has been given. A claim that starts after it was handed
        # out must get a higher one; a lower one means the counter was lost (see claim()).
        self._max_token = 0
        self._token_lock = threading.Lock()
        try:
            self._client.ping()
            for name, source in (
                ("claim", _CLAIM),
                ("ack", _ACK),
                ("renew", _RENEW),
                ("release", _RELEASE),
                ("requeue", _REQUEUE),
                ("make_stale", _MAKE_STALE),
                ("revive", _REVIVE),
                ("offer_read", _OFFER_READ),
                ("offer_apply", _OFFER_APPLY),
                ("counts", _COUNTS),
                ("next_event", _NEXT_EVENT),
            ):
                script = self._client.register_script(source)
                script.sha = self._client.script_load(source)  # so the first call is one EVALSHA
                self._scripts[name] = script
        except RedisError as exc:
            self._close_owned()
            raise BackendError(f"frontier {self.url}: cannot connect: {_one_line(exc)}") from exc

    def __repr__(self) -> str:
        return f"RedisFrontier({self.url!r}, prefix={self.prefix!r})"

    def location(self) -> str:
        return f"{self.url} (prefix {self.prefix!r})"

    def _base(self, source: str) -> str:
        return "{" + f"{self.prefix}:{source}" + "}"

    def _run(self, what: str, name: str, source: str, args: Sequence[Any]) -> Any:
        keys = [self._base(source)]
        if name == "claim":
            keys.append(self._token_key)
        try:
            return self._scripts[name](keys=keys, args=args, client=self._client)
        except RedisError as exc:
            raise BackendError(f"frontier {self.url}: {what} failed: {_one_line(exc)}") from exc

    # --- planning --------------------------------------------------------------------------
    def offer(
        self,
        source: str,
        offers: Iterable[Offer],
        *,
        now: float,
        queue_ttl_s: float,
        rank_for: RankFor,
        run_id: str,
    ) -> OfferResult:
        result = OfferResult()
        seen: set[str] = set()  # a URL offered twice in one call is queued once
        head = [_num(now), _num(now + queue_ttl_s), run_id]
        for chunk in _chunks(offers, _CHUNK):
            pending: list[Offer] = []
            for o in chunk:
                if o.url in seen:
                    result.already_queued += 1
                else:
                    seen.add(o.url)
                    pending.append(o)
            rounds = 0
            while pending:
                rounds += 1
                if rounds > _MAX_OFFER_ROUNDS:
                    raise BackendError(
                        f"frontier {self.url}: offer failed: records kept changing under "
                        f"{len(pending)} URLs of source {source!r}"
                    )
                urls = json.dumps([o.url for o in pending], ensure_ascii=False)
                read = json.loads(self._run("offer", "offer_read", source, [urls]))
                flat: list[str] = []
                actions: list[str] = []
                for o, version, state_no, fresh_until, fetched in zip(
                    pending, read[::4], read[1::4], read[2::4], read[3::4], strict=True
                ):
                    row = (
                        StoredRow(
                            STATES[state_no - 1],
                            float(fresh_until) if fresh_until else None,
                            float(fetched) if fetched else None,
                        )
                        if version
                        else None
                    )
                    action = plan_decision(row, now)
                    actions.append(action)
                    if action == "enqueue":
                        score = _num(-rank_for(o.url, None, o.fresh_s))
                        flat += ("n", o.url, "", score)
                    elif action == "requeue":
                        last = row.last_fetched_at if row else None
                        age = None if last is None else now - last
                        flat += ("r", o.url, version, _num(-rank_for(o.url, age, o.fresh_s)))
                    else:
                        flat += ("t", o.url, version, "")
                args = [*head, json.dumps(flat, ensure_ascii=False)]
                conflicts = {int(i) - 1 for i in self._run("offer", "offer_apply", source, args)}
                for n, done in enumerate(actions):
                    if n in conflicts:
                        continue
                    if done in ("enqueue", "requeue"):
                        result.enqueued += 1
                    elif done == "fresh":
                        result.fresh_skipped += 1
                    elif done == "already_queued":
                        result.already_queued += 1
                    else:
                        result.already_dead += 1
                pending = [pending[n] for n in sorted(conflicts)]
        return result

    # --- claiming --------------------------------------------------------------------------
    def claim(self, source: str, limit: int, *, now: float, lease_s: float) -> Lease:
        expires_at = now + lease_s
        args = [_num(now), _num(expires_at), max(int(limit), 0)]
        floor = self._max_token
        token, reclaimed, expired, packed = self._run("claim", "claim", source, args)
        token = int(token)
        with self._token_lock:
            self._max_token = max(self._max_token, token)
        if token <= floor:
            # A Redis that restarted without persistence starts the counter again at 1; going
            # on would hand out tokens older than ones already in use. The items of this claim
            # stay leased to nobody until the lease expires.
            raise BackendError(
                f"frontier {self.url}: claim failed: fencing token went back from {floor} to "
                f"{token}; the Redis lost its data (restarted without persistence?)"
            )
        flat = json.loads(packed) if packed else []
        items = tuple(
            ClaimedItem(u, int(att), float(first) if first else None, float(enq))
            for u, att, first, enq in zip(
                flat[::4], flat[1::4], flat[2::4], flat[3::4], strict=True
            )
        )
        return Lease(
            source, token, expires_at, items, expired=int(expired), reclaimed=int(reclaimed)
        )

    def renew(self, lease: Lease, *, now: float, lease_s: float) -> int:
        args = [lease.token, _num(now + lease_s), *(i.url for i in lease.items)]
        return int(self._run("renew", "renew", lease.source, args))

    def ack(self, lease: Lease, outcomes: Sequence[Outcome], *, now: float) -> AckResult:
        flat: list[Any] = []
        for o in outcomes:
            if isinstance(o, Completed):
                flat += ("c", o.url, _num(o.fresh_until), _num(o.fetched_at), _num(o.cost))
            elif isinstance(o, RetryLater):
                flat += (
                    "r",
                    o.url,
                    _num(o.not_before),
                    _num(o.rank),
                    str(int(o.attempts)),
                    _num(o.first_attempt_at),
                    o.error,
                )
            elif isinstance(o, DeadLettered):
                flat += ("d", o.url, str(int(o.attempts)), o.error)
            else:  # pragma: no cover - the type union is closed
                raise TypeError(f"unknown outcome {o!r}")
        if not outcomes:
            return AckResult()
        args = [lease.token, _num(now), json.dumps(flat, ensure_ascii=False)]
        reply = self._run("ack", "ack", lease.source, args)
        return AckResult(int(reply[0]), [outcomes[int(i) - 1].url for i in reply[1:]])

    def release(self, lease: Lease, *, now: float) -> int:
        args = [lease.token, _num(now), *(i.url for i in lease.items)]
        return int(self._run("release", "release", lease.source, args))

    def requeue(self, source: str, urls: Sequence[str], *, now: float, queue_ttl_s: float) -> int:
        if not urls:
            return 0
        args = [_num(now), _num(now + queue_ttl_s), *urls]
        return int(self._run("requeue", "requeue", source, args))

    def revive(self, source: str, pages: Sequence[Completed]) -> int:
        if not pages:
            return 0
        flat: list[Any] = []
        for p in pages:
            flat += (p.url, _num(p.fresh_until), _num(p.fetched_at), _num(p.cost))
        args = [json.dumps(flat, ensure_ascii=False)]
        return int(self._run("revive", "revive", source, args))

    def make_stale(self, source: str, urls: Sequence[str]) -> int:
        if not urls:
            return 0
        return int(self._run("make_stale", "make_stale", source, list(urls)))

    # --- reading ---------------------------------------------------------------------------
    def _counts(self, what: str, source: str, run_id: str | None) -> StateCounts:
        args = [""] if run_id is None else ["run", run_id]
        reply = self._run(what, "counts", source, args)
        counts = StateCounts()
        for i in range(0, len(reply), 2):
            n = int(reply[i + 1])
            if n:
                setattr(counts, STATES[int(reply[i]) - 1], n)
        return counts

    def counts(self, source: str) -> StateCounts:
        return self._counts("counts", source, None)

    def run_counts(self, source: str, run_id: str) -> StateCounts:
        return self._counts("run counts", source, run_id)

    def next_event_at(self, source: str, *, now: float) -> float | None:
        reply = self._run("next event", "next_event", source, [_num(now)])
        return None if reply is None else float(reply)

    def close(self) -> None:
        self._close_owned()

    def _close_owned(self) -> None:
        if self._owns_client:
            try:
                self._client.close()
                self._client.connection_pool.disconnect()
            except RedisError:  # closing a pool to a dead server is not an error
                pass
