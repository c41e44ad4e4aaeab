-- Drop an owner's triage claim.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  entry id
-- ARGV[4]  owner
-- Returns 1 if the owner's claim was dropped.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local key = P .. ARGV[3]
if redis.call('HGET', key, 'claimed_by') ~= ARGV[4] then return 0 end
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
return remember(1)
