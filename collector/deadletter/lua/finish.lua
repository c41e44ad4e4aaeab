-- A reviewer's decision on the entry of a review message. Acks the message whatever happens.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  events maxlen
-- ARGV[4]  message id
-- ARGV[5]  entry id
-- ARGV[6]  resolution kind
-- ARGV[7]  resolution detail
-- ARGV[8]  event data
-- Returns 1 if this call resolved the entry.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local msg, id = ARGV[4], ARGV[5]
local key = P .. id
local cur = current(key)
if not cur then return 0 end
local wrong = check_message(cur.src, msg, id)
if wrong then return redis.error_reply(wrong) end
drop_message(cur.src, msg)
if cur.status ~= 'review' or cur.msg ~= msg then return remember(0) end
redis.call('HSET', key, 'status', 'resolved', 'resolution_kind', ARGV[6], 'resolution', ARGV[7])
redis.call('HDEL', key, 'review_msg', 'review_reason')
move(id, cur.src, cur.lab, 'review', 'resolved')
event(ARGV[3], 'resolved', id, ARGV[8])
return remember(1)
