-- The entries of review messages just delivered to a reviewer from a source's review stream.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  source
-- ARGV[4..] message id / entry id pairs
-- Returns one hash per pair, empty for messages that are moot (entry gone, no longer in review,
-- or re-escalated since): those are acked and deleted so that nobody gets them again.
local out = {}
for i = 4, #ARGV, 2 do
  local msg, id = ARGV[i], ARGV[i + 1]
  local key = P .. id
  local cur = redis.call('HMGET', key, 'status', 'review_msg')
  if cur[1] == 'review' and cur[2] == msg then
    out[#out + 1] = redis.call('HGETALL', key)
  else
    drop_message(ARGV[3], msg)
    out[#out + 1] = {}
  end
end
return out
