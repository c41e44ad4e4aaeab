-- Shared by every script: key names, record fields, counters, queue and expiry indexes. Redis
-- runs each script as one chunk: collector/_redis.py's REPLAY_LUA, this file, then the script's
-- file, so a script reads the names below as locals (.luacheckrc says so to luacheck).
--
-- KEYS[1] of every script is the source's base B = {<prefix>:<source>}: every key of the source
-- is B .. ':<name>', in one hash slot. A replayed script's last KEY is its reply record.
local B = KEYS[1]
local K_Q, K_D, K_P, K_L = B .. ':q', B .. ':d', B .. ':p', B .. ':l'
local K_XB, K_N, K_RUNS, K_ERR = B .. ':xb', B .. ':n', B .. ':runs', B .. ':err'
local K_F, K_E = B .. ':f', B .. ':e'  -- due index: done items by fresh_until; expired items
local K_HIST = B .. ':hist'  -- url -> the page's history (collector/frontier/base.py PageHistory)
-- lease holders: B:lh token -> holder, B:ht:<holder> its tokens, B:hb holder -> last heartbeat
local K_LH, K_HB = B .. ':lh', B .. ':hb'
-- item states, as counted in B:n and B:rc:<run> (collector/frontier/base.py STATES)
local Q, L, D, X, E, R = 1, 2, 3, 4, 5, 6  -- queued, leased, done, dead, expired, retired

-- An item's record (a msgpack array, see save) holds these fields by position. Absent fields
-- are nil or false (zero), so they take no space.
local F_STATE = 1             -- Q, L, D, X, E or R
local F_RUN = 2               -- the run's small number (run_number) the item is tagged with
local F_RANK = 3              -- false while the item's B:q score holds it
local F_ENQUEUED_AT = 4
local F_EXPIRES_AT = 5        -- end of its queue TTL (in the expiry list of that time)
local F_NOT_BEFORE = 6        -- a retry waits until then (B:d, then B:p)
local F_ATTEMPTS = 7
local F_FIRST_ATTEMPT_AT = 8
local F_LEASE_TOKEN = 9       -- the fencing token of the lease that holds it
local F_FRESH_UNTIL = 10      -- a done item is due again then (B:f)
local F_LAST_FETCHED_AT = 11
local F_COST = 12
local F_HAS_ERROR = 13        -- 1: B:err holds its last_error
local F_UNLISTED = 14         -- 1: a changed seed list no longer names it (adopt leaves it alone
                              -- once settled)

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
-- Saved as a msgpack array: holes become false (as absent to every script), because cmsgpack packs
-- a table with holes as a map, a key byte more per field. Records stay <= 64 bytes more often,
-- and a bucket with one longer record is no listpack any more (~90 bytes a record, not ~40).
-- Records saved as maps (before) read the same.
local function save(k, f, rec)
  local n = table.maxn(rec)
  while n > 0 and not rec[n] do rec[n] = nil; n = n - 1 end
  for i = 1, n do if rec[i] == nil then rec[i] = false end end
  redis.call('HSET', k, f, cmsgpack.pack(rec))
end
-- A done page's validators (ETag, Last-Modified: what its next fetch sends back) live beside the
-- records, not in them: in B:v:HHHH, the record's bucket number, under the record's field, as a
-- msgpack array {etag or false, last_modified or false}. In the record they would take most done
-- records past 64 bytes, and every bucket holding one out of Redis' listpack encoding. No field:
-- none known (records saved before validators were kept read the same).
local function vloc(k) return B .. ':v:' .. string.sub(k, #B + 4) end
local function get_validators(k, f)
  local raw = redis.call('HGET', vloc(k), f)
  if not raw then return false, false end
  local v = cmsgpack.unpack(raw)
  return v[1], v[2]
end
local function set_validators(k, f, etag, modified)
  if etag or modified then
    redis.call('HSET', vloc(k), f, cmsgpack.pack({etag or false, modified or false}))
  else
    redis.call('HDEL', vloc(k), f)
  end
end

-- last_error lives in B:err; F_HAS_ERROR says there is one to clear
local function set_error(url, rec, text)
  redis.call('HSET', K_ERR, url, text); rec[F_HAS_ERROR] = 1
end
local function clear_error(url, rec)
  if rec[F_HAS_ERROR] then redis.call('HDEL', K_ERR, url); rec[F_HAS_ERROR] = nil end
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
  bump(rec[F_RUN], rec[F_STATE], -1); bump(rec[F_RUN], to, 1); rec[F_STATE] = to
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

-- Every time an item enters the queue its url goes into the list of its expires_at, packed: one
-- list entry holds up to PACK urls, in the order they came, each stored as the length of the
-- prefix it shares with the one before (a byte, at most 255), the length of the rest (a byte; 255
-- and 4 more bytes from 255 on) and the rest, after a first byte 0. Neighbouring urls of a seed
-- list mostly share their site and path, so a url costs a few bytes there instead of all of them
-- (~39 bytes for the bench's). Sorting each entry first gained little (random hosts share
-- nothing, one site's urls come in order anyway) for ~30 % more script time. An entry whose first
-- byte is not 0 is one plain url: layout 1, before packing (urls never start with NUL).
local PACK = 1000
local function pack_urls(urls, from, to)
  local parts, prev, p = {'\0'}, '', 0
  for i = from, to do
    local u = urls[i]
    -- the shared prefix, starting from the last one: neighbours share about as much
    local n = math.min(#u, #prev, 255)
    if p > n then p = n end
    if string.sub(u, 1, p) == string.sub(prev, 1, p) then
      while p < n and string.byte(u, p + 1) == string.byte(prev, p + 1) do p = p + 1 end
    else  -- the longest shared prefix is shorter than p: bisect (prefix equality is monotone)
      local lo, hi = 0, p - 1
      while lo < hi do
        local mid = math.floor((lo + hi + 1) / 2)
        if string.sub(u, 1, mid) == string.sub(prev, 1, mid) then lo = mid else hi = mid - 1 end
      end
      p = lo
    end
    local rest = #u - p
    if rest < 255 then
      parts[#parts + 1] = string.char(p, rest)
    else
      parts[#parts + 1] = string.char(p, 255) .. struct.pack('>I4', rest)
    end
    parts[#parts + 1] = string.sub(u, p + 1)
    prev = u
  end
  return table.concat(parts)
end
-- the urls of one expiry list entry (see pack_urls)
local function unpack_urls(entry)
  if string.byte(entry, 1) ~= 0 then return {entry} end
  local out, prev, pos, last = {}, '', 2, #entry
  while pos <= last do
    local p, rest = string.byte(entry, pos, pos + 1)
    pos = pos + 2
    if rest == 255 then rest, pos = struct.unpack('>I4', entry, pos) end
    prev = string.sub(prev, 1, p) .. string.sub(entry, pos, pos + rest - 1)
    pos = pos + rest
    out[#out + 1] = prev
  end
  return out
end

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
    local packed = {}
    for i = 1, #urls, PACK do
      packed[#packed + 1] = pack_urls(urls, i, math.min(i + PACK - 1, #urls))
    end
    bulk('RPUSH', B .. ':x:' .. name, packed, 1000)
  end
  pushes = {}
end

-- put a queued record in its indexes (the caller has set rec[F_STATE] = Q and saves it)
local function enter_queue(url, rec, now)
  local nb = rec[F_NOT_BEFORE]
  if nb and nb > now then
    redis.call('ZADD', K_D, fmt(nb), url)
  else
    redis.call('ZADD', K_Q, fmt(-rec[F_RANK]), url)
    if nb then redis.call('ZADD', K_P, fmt(nb), url) end
  end
  push_expiry(url, rec[F_EXPIRES_AT])
end
local function leave_queue(url, rec)
  if rec[F_NOT_BEFORE] then redis.call('ZREM', K_D, url); redis.call('ZREM', K_P, url) end
  redis.call('ZREM', K_Q, url)
end

-- the small number of a run id (kept in each record), created on first use
local function run_number(run_id)
  local run = redis.call('HGET', K_RUNS, run_id)
  if run then return tonumber(run) end
  run = redis.call('HLEN', K_RUNS) + 1
  redis.call('HSET', K_RUNS, run_id, run)
  return run
end

-- queued and leased items of the source not tagged with run: exact, from the counters
local function not_ours(run)
  local n = redis.call('HMGET', K_N, Q, L)
  local r = redis.call('HMGET', B .. ':rc:' .. run, Q, L)
  return (tonumber(n[1]) or 0) + (tonumber(n[2]) or 0) - (tonumber(r[1]) or 0)
    - (tonumber(r[2]) or 0)
end

-- One page of a walk over the sorted sets keys[1..]: from set ki, position pos, at most budget
-- members while more() is true. fn(url, key) returns true when it removed the member (the next
-- one then takes its position). Returns where the next page starts (ki = #keys + 1: all read).
-- Between pages other clients may move members, so a walk by position may miss some: callers
-- that must see every member go round again until an exact count says none is left.
local function page_sets(keys, ki, pos, budget, fn, more)
  while ki <= #keys and budget > 0 and more() do
    local page = redis.call('ZRANGE', keys[ki], pos, pos + math.min(budget, 1000) - 1)
    if #page == 0 then
      ki, pos = ki + 1, 0
    else
      for _, url in ipairs(page) do
        if not fn(url, keys[ki]) then pos = pos + 1 end
        budget = budget - 1
      end
    end
  end
  return ki, pos
end
