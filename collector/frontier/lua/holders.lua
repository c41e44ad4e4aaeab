-- Who holds the leased items.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV     none
-- Returns holder, leased items, last heartbeat ('' when it never beat) for every holder of a
-- leased item ('' for anonymous claims). O(leased items), which a claim bounds.
local per = {}
for _, url in ipairs(redis.call('ZRANGE', K_L, 0, -1)) do
  local rec = load(url)
  if rec and rec[F_STATE] == L then
    local holder = rec[F_LEASE_TOKEN] and redis.call('HGET', K_LH, rec[F_LEASE_TOKEN]) or false
    holder = holder or ''
    per[holder] = (per[holder] or 0) + 1
  end
end
local out = {}
for holder, n in pairs(per) do
  out[#out + 1] = holder
  out[#out + 1] = n
  out[#out + 1] = holder ~= '' and (redis.call('HGET', K_HB, holder) or '') or ''
end
return out
