-- ARGV[3] id, ARGV[4] owner. Returns 1 if the owner's claim was dropped.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local key = P .. ARGV[3]
if redis.call('HGET', key, 'claimed_by') ~= ARGV[4] then return 0 end
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
return remember(1)
