-- ARGV[3] maxlen, ARGV[4] message id, ARGV[5] entry id, ARGV[6] resolution, ARGV[7] event data.
-- Acks the message whatever happens; returns 1 if this call resolved the entry.
local msg, id = ARGV[4], ARGV[5]
local found = redis.call('XRANGE', P .. 'review', msg, msg)
if #found > 0 then
  local fields, entry = found[1][2], nil
  for j = 1, #fields, 2 do if fields[j] == 'entry' then entry = fields[j + 1] end end
  if entry ~= id then
    return redis.error_reply('DLMISMATCH review message ' .. msg .. ' is for entry '
                             .. tostring(entry) .. ', not ' .. id)
  end
end
local key = P .. id
local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'review_msg')
redis.pcall('XACK', P .. 'review', 'reviewers', msg)
redis.call('XDEL', P .. 'review', msg)
if not cur[1] or cur[4] ~= 'review' or cur[5] ~= msg then return 0 end
redis.call('HSET', key, 'status', 'resolved', 'resolution', ARGV[6])
redis.call('HDEL', key, 'review_msg', 'review_reason')
move(id, cur[1], cur[2], cur[3], 'review', 'resolved')
event(ARGV[3], 'resolved', id, ARGV[7])
return 1
