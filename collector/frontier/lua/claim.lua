-- Lease the best-ranked due items under a new fencing token, after putting expired leases
-- back in the queue and expiring items past their queue TTL.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the fencing-token counter ({prefix}:fencing_token)
-- KEYS[3]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  now
-- ARGV[2]  lease_expires
-- ARGV[3]  limit
-- ARGV[4]  holder ('' for an anonymous claim)
-- Returns token, reclaimed, expired, and a JSON array of url, attempts, first_attempt_at,
-- enqueued_at, etag, last_modified, history per item (times as exact text, '' for none), or '' when
-- nothing was leased.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local now_s, lexp, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = tonumber(now_s)

-- 1. leases that expired go back to the queue
local reclaimed = 0
local due = redis.call('ZRANGEBYSCORE', K_L, '-inf', now_s)
if #due > 0 then bulk('ZREM', K_L, due, 1000) end
for _, url in ipairs(due) do
  local rec, k, f = load(url)
  if rec and rec[F_STATE] == L then
    rec[F_LEASE_TOKEN] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
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
  for s = 0, n - 1, 50 do
    for _, entry in ipairs(redis.call('LRANGE', lk, s, s + 49)) do
      for _, url in ipairs(unpack_urls(entry)) do
        local rec, k, f = load(url)
        if rec and rec[F_STATE] == Q and rec[F_EXPIRES_AT] <= now then
          if not rec[F_RANK] then rec[F_RANK] = -tonumber(redis.call('ZSCORE', K_Q, url) or '0') end
          leave_queue(url, rec); move(rec, E); clear_error(url, rec); save(k, f, rec)
          redis.call('ZADD', K_E, now_s, url)
          expired = expired + 1
        end
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
      redis.call('ZADD', K_Q, fmt(-rec[F_RANK]), url)
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
    if not rec or rec[F_STATE] ~= Q then
      gone[#gone + 1] = url  -- cannot happen; heal the index rather than fail the claim
    elseif rec[F_NOT_BEFORE] and rec[F_NOT_BEFORE] > now then
      skip = skip + 1
    else
      gone[#gone + 1] = url
      if rec[F_NOT_BEFORE] then gone_p[#gone_p + 1] = url end
      rec[F_RANK], rec[F_LEASE_TOKEN] = -tonumber(page[p + 1]), token
      move(rec, L); save(k, f, rec)
      leases[#leases + 1] = lexp; leases[#leases + 1] = url
      out[#out + 1] = url
      out[#out + 1] = rec[F_ATTEMPTS] or 0
      out[#out + 1] = rec[F_FIRST_ATTEMPT_AT] and cfmt(rec[F_FIRST_ATTEMPT_AT]) or ''
      out[#out + 1] = cfmt(rec[F_ENQUEUED_AT])
      local etag, modified = get_validators(k, f)
      out[#out + 1] = etag or ''
      out[#out + 1] = modified or ''
      out[#out + 1] = redis.call('HGET', K_HIST, url) or ''
      taken = taken + 1
    end
  end
  if #gone > 0 then bulk('ZREM', K_Q, gone, 1000) end
  if #gone_p > 0 then bulk('ZREM', K_P, gone_p, 1000) end
end
if #leases > 0 then bulk('ZADD', K_L, leases, 1000) end
local holder = ARGV[4] or ''
if holder ~= '' and taken > 0 then
  redis.call('HSET', K_LH, token, holder)
  redis.call('SADD', B .. ':ht:' .. holder, token)
end
flush_counts()
return remember({token, reclaimed, expired, taken > 0 and cjson.encode(out) or ''})
