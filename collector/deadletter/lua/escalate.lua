-- Move an open entry to manual review: a message in its source's review stream.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  events maxlen
-- ARGV[4]  entry id
-- ARGV[5]  reason
-- ARGV[6]  event data (without the message id)
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
