-- ARGV[3] maxlen, ARGV[4] id, ARGV[5] resolution, ARGV[6] event data, ARGV[7] '1' when the
-- item was requeued (the entry's requeues count grows). Returns 1 if resolved now.
local key = P .. ARGV[4]
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'review_msg')
if not cur[1] or cur[4] == 'resolved' then return 0 end
redis.call('HSET', key, 'status', 'resolved', 'resolution', ARGV[5])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
if ARGV[7] == '1' then redis.call('HINCRBY', key, 'requeues', 1) end
move(ARGV[4], cur[1], cur[2], cur[3], cur[4], 'resolved')
forget_review(key, cur[5])  -- a pending review of it is moot: nobody should get it any more
event(ARGV[3], 'resolved', ARGV[4], ARGV[6])
return 1
