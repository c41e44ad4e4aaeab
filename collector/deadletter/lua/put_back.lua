-- Hand a held review back to the queue: the message is replaced by a new one at the end of
-- the source's review stream, which no reviewer holds.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  message id
-- ARGV[4]  entry id
-- Returns the new message id, or false when the message is not the entry's current review.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local msg, id = ARGV[3], ARGV[4]
local key = P .. id
local cur = current(key)
if not cur then return false end
local wrong = check_message(cur.src, msg, id)
if wrong then return redis.error_reply(wrong) end
if cur.status ~= 'review' or cur.msg ~= msg then return false end
drop_message(cur.src, msg)
local new = redis.call('XADD', rkey(cur.src), '*', 'entry', id, 'reason', cur.reason or '')
redis.call('HSET', key, 'review_msg', new)
return remember(new)
