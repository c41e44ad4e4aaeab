-- ARGV[3] events maxlen, then 19 values per entry in the order put() sends them.
-- Returns how many ids were new.
local new = 0
for i = 4, #ARGV, 19 do
  local id = ARGV[i]
  local key = P .. id
  local last = ARGV[i + 8]
  local cur = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'attempts')
  local src = cur[1]
  if not src then
    new = new + 1
    src = ARGV[i + 1]
    local stage, cls, st = ARGV[i + 3], ARGV[i + 4], ARGV[i + 14]
    redis.call('HSET', key, 'id', id, 'source', src, 'url', ARGV[i + 2], 'stage', stage,
               'error_class', cls, 'message', ARGV[i + 5], 'attempts', ARGV[i + 6],
               'first_seen', ARGV[i + 7], 'last_seen', last, 'record_key', ARGV[i + 9],
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17], 'status', st)
    if ARGV[i + 13] == '1' then redis.call('HSET', key, 'flow_run_id', ARGV[i + 12]) end
    if ARGV[i + 16] == '1' then redis.call('HSET', key, 'resolution', ARGV[i + 15]) end
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage), id)
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage) .. ':' .. esc(src), id)
    redis.call('SADD', P .. 'ix:class:' .. esc(cls), id)
    local pos = 1
    while true do  -- every ':'-suffix, so 'a:b:http_500' matches 'http_500' and 'b:http_500'
      local c = string.find(cls, ':', pos, true)
      if not c then break end
      redis.call('SADD', P .. 'ix:class:' .. esc(string.sub(cls, c + 1)), id)
      pos = c + 1
    end
    status_add(id, src, stage, cls, st)
  else
    local attempts = ARGV[i + 6]
    if tonumber(cur[5]) > tonumber(attempts) then attempts = cur[5] end
    redis.call('HSET', key, 'message', ARGV[i + 5], 'attempts', attempts, 'last_seen', last,
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17])
    if ARGV[i + 13] == '1' then
      redis.call('HSET', key, 'flow_run_id', ARGV[i + 12])
    else
      redis.call('HDEL', key, 'flow_run_id')
    end
    if cur[4] == 'resolved' then  -- seen again after its resolution: open again
      redis.call('HSET', key, 'status', 'open')
      redis.call('HDEL', key, 'resolution', 'claimed_by', 'claim_expires')
      move(id, src, cur[2], cur[3], 'resolved', 'open')
    end
  end
  redis.call('ZADD', P .. 'ix:seen', last, id)
  redis.call('ZADD', P .. 'ix:seen:' .. esc(src), last, id)
  event(ARGV[3], 'quarantined', id, ARGV[i + 18])
end
return new
