-- Take an open entry for triage (a claim that expires).
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  entry id
-- ARGV[4]  owner
-- ARGV[5]  now
-- ARGV[6]  expiry of the claim
-- Returns 1 if the claim is taken (also again by its owner).
local key = P .. ARGV[3]
local cur = redis.call('HMGET', key, 'status', 'claimed_by', 'claim_expires')
if cur[1] ~= 'open' then return 0 end
if cur[2] and cur[2] ~= ARGV[4] and tonumber(cur[3]) > tonumber(ARGV[5]) then return 0 end
redis.call('HSET', key, 'claimed_by', ARGV[4], 'claim_expires', ARGV[6])
return 1
