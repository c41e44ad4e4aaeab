-- When the next item becomes claimable.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV[1]  now (unused: the earliest time is returned, past or not)
-- Returns the earliest not_before of a queued item (0 for those without one) or lease expiry
-- (exact text), or false when nothing is queued or leased.
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
