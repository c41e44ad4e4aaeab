-- ARGV[3] id, ARGV[4] owner, ARGV[5] now, ARGV[6] expiry. Returns 1 if the claim is taken.
local key = P .. ARGV[3]
local cur = redis.call('HMGET', key, 'status', 'claimed_by', 'claim_expires')
if cur[1] ~= 'open' then return 0 end
if cur[2] and cur[2] ~= ARGV[4] and tonumber(cur[3]) > tonumber(ARGV[5]) then return 0 end
redis.call('HSET', key, 'claimed_by', ARGV[4], 'claim_expires', ARGV[6])
return 1
