-- ARGV[3] id, ARGV[4] owner. Returns 1 if the owner's claim was dropped.
local key = P .. ARGV[3]
if redis.call('HGET', key, 'claimed_by') ~= ARGV[4] then return 0 end
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
return 1
