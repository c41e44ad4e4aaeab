-- ARGV[3] maxlen, ARGV[4] id, ARGV[5] kind, ARGV[6] detail, ARGV[7] event data, ARGV[8] '1'
-- when the item was requeued (the entry's requeues count grows). Returns 1 if resolved now.
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
