-- ARGV[3] maxlen, ARGV[4] id, ARGV[5] reason, ARGV[6] event data (without the message id).
-- Returns the review message id (in the source's review stream), or false if not open.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local id = ARGV[4]
local key = P .. id
local cur = current(key)
if not cur or cur.status ~= 'open' then return false end
local msg = redis.call('XADD', rkey(cur.src), '*', 'entry', id, 'reason', ARGV[5])
redis.call('HSET', key, 'status', 'review', 'review_msg', msg, 'review_reason', ARGV[5])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
move(id, cur.src, cur.lab, 'open', 'review')
event(ARGV[3], 'escalated', id, ARGV[6])
return remember(msg)
