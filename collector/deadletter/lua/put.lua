-- ARGV[3] events maxlen, then 23 values per entry in the order put() sends them.
-- Returns how many ids were new.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local new = 0
for i = 4, #ARGV, 23 do
  local id = ARGV[i]
  local key = P .. id
  local last = ARGV[i + 8]
  local cur = current(key)
  local src = ARGV[i + 1]
  local stage, cls, cause = ARGV[i + 3], ARGV[i + 4], ARGV[i + 19]
  local lab = label(stage, cause, cls)
  if not cur then
    new = new + 1
    local st = ARGV[i + 14]
    redis.call('HSET', key, 'id', id, 'source', src, 'url', ARGV[i + 2], 'stage', stage,
               'error_class', cls, 'message', ARGV[i + 5], 'attempts', ARGV[i + 6],
               'first_seen', ARGV[i + 7], 'last_seen', last, 'record_key', ARGV[i + 9],
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17], 'status', st, 'cause', cause, 'trace_id', ARGV[i + 21],
               'url_digest', ARGV[i + 22], 'v', '2')
    if ARGV[i + 13] == '1' then redis.call('HSET', key, 'flow_run_id', ARGV[i + 12]) end
    if ARGV[i + 16] == '1' then redis.call('HSET', key, 'resolution', ARGV[i + 15]) end
    if ARGV[i + 20] ~= '' then redis.call('HSET', key, 'resolution_kind', ARGV[i + 20]) end
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage), id)
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage) .. ':' .. esc(src), id)
    redis.call('SADD', P .. 'ix:class:' .. esc(cls), id)
    status_add(id, src, lab, st)
  else
    src = cur.src
    local attempts = ARGV[i + 6]
    if tonumber(cur.attempts) > tonumber(attempts) then attempts = cur.attempts end
    redis.call('HSET', key, 'message', ARGV[i + 5], 'attempts', attempts, 'last_seen', last,
               'payload', ARGV[i + 10], 'failed_expectations', ARGV[i + 11],
               'codec', ARGV[i + 17], 'cause', cause, 'trace_id', ARGV[i + 21],
               'url_digest', ARGV[i + 22])
    if ARGV[i + 13] == '1' then
      redis.call('HSET', key, 'flow_run_id', ARGV[i + 12])
    else
      redis.call('HDEL', key, 'flow_run_id')
    end
    local st = cur.status
    if st == 'resolved' then  -- seen again after its resolution: open again
      st = 'open'
      redis.call('HSET', key, 'status', 'open')
      redis.call('HDEL', key, 'resolution', 'resolution_kind', 'claimed_by', 'claim_expires')
    end
    if st ~= cur.status or lab ~= cur.lab then  -- the cause may differ this time
      status_rem(id, src, cur.lab, cur.status)
      status_add(id, src, lab, st)
    end
  end
  redis.call('ZADD', P .. 'ix:seen', last, id)
  redis.call('ZADD', P .. 'ix:seen:' .. esc(src), last, id)
  event(ARGV[3], 'quarantined', id, ARGV[i + 18])
end
return remember(new)
