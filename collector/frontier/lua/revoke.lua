-- Every item a holder leases goes back to the queue unchanged; its tokens and heartbeat are
-- forgotten.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  holder
-- ARGV[2]  now
-- Returns how many items came back.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local holder, now = ARGV[1], tonumber(ARGV[2])
local set = B .. ':ht:' .. holder
local tokens = {}
for _, t in ipairs(redis.call('SMEMBERS', set)) do tokens[tonumber(t)] = true end
local revoked = 0
if next(tokens) then
  local back = {}
  for _, url in ipairs(redis.call('ZRANGE', K_L, 0, -1)) do
    local rec, k, f = load(url)
    if rec and rec[F_STATE] == L and rec[F_LEASE_TOKEN] and tokens[rec[F_LEASE_TOKEN]] then
      back[#back + 1] = url
      rec[F_LEASE_TOKEN] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
      revoked = revoked + 1
    end
  end
  if #back > 0 then bulk('ZREM', K_L, back, 1000) end
  local names = {}
  for t in pairs(tokens) do names[#names + 1] = t end
  bulk('HDEL', K_LH, names, 1000)
end
redis.call('DEL', set)
redis.call('HDEL', K_HB, holder)
flush_expiry()
flush_counts()
return remember(revoked)
