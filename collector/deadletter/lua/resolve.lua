-- Resolve an entry that is not resolved yet (open or in review).
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  events maxlen
-- ARGV[4]  entry id
-- ARGV[5]  resolution kind
-- ARGV[6]  resolution detail
-- ARGV[7]  event data
-- ARGV[8]  '1' when the item was requeued (the entry's requeues count grows)
-- Returns 1 if resolved now.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local id = ARGV[4]
local key = P .. id
local cur = current(key)
if not cur or cur.status == 'resolved' then return 0 end
redis.call('HSET', key, 'status', 'resolved', 'resolution_kind', ARGV[5], 'resolution', ARGV[6])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
if ARGV[8] == '1' then redis.call('HINCRBY', key, 'requeues', 1) end
move(id, cur.src, cur.lab, cur.status, 'resolved')
forget_review(key, cur.src, cur.msg)  -- a pending review of it is moot: nobody should get it
event(ARGV[3], 'resolved', id, ARGV[7])
return remember(1)
