-- ARGV[3] maxlen, ARGV[4] id, ARGV[5] reason, ARGV[6] event data (without the message id).
-- Returns the review message id, or false if the entry is not open.
local key = P .. ARGV[4]
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status')
if not cur[1] or cur[4] ~= 'open' then return false end
local msg = redis.call('XADD', P .. 'review', '*', 'entry', ARGV[4], 'reason', ARGV[5])
redis.call('HSET', key, 'status', 'review', 'review_msg', msg, 'review_reason', ARGV[5])
redis.call('HDEL', key, 'claimed_by', 'claim_expires')
move(ARGV[4], cur[1], cur[2], cur[3], 'open', 'review')
event(ARGV[3], 'escalated', ARGV[4], ARGV[6])
return msg
