-- Queued items past their queue TTL get a new one: the earliest expiry lists' entries (at or
-- before now, each a packed run of urls), about a page of urls at a time; urls of items that
-- moved on are dropped, as a claim drops them.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  now
-- ARGV[2]  the new expires_at
-- ARGV[3]  page size
-- Returns how many were renewed and 1 when lists at or before now are left (the caller runs the
-- script again), else 0.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local now_s, budget = ARGV[1], tonumber(ARGV[3])
local now, new_exp = tonumber(now_s), tonumber(ARGV[2])
local renewed = 0
while budget > 0 do
  local first = redis.call('ZRANGEBYSCORE', K_XB, '-inf', now_s, 'LIMIT', 0, 1)
  if #first == 0 then break end
  local name = first[1]
  local lk = B .. ':x:' .. name
  local entry = redis.call('LINDEX', lk, 0)  -- up to PACK urls (pack_urls)
  if entry then
    for _, url in ipairs(unpack_urls(entry)) do
      local rec, k, f = load(url)
      if rec and rec[F_STATE] == Q and rec[F_EXPIRES_AT] <= now then
        rec[F_EXPIRES_AT] = new_exp
        push_expiry(url, new_exp)
        save(k, f, rec)
        renewed = renewed + 1
      end
      budget = budget - 1
    end
    redis.call('LPOP', lk)
  else  -- the bucket is read to its end
    redis.call('DEL', lk)
    redis.call('ZREM', K_XB, name)
  end
end
flush_expiry()
local left = redis.call('ZRANGEBYSCORE', K_XB, '-inf', now_s, 'LIMIT', 0, 1)
return remember({renewed, #left})
