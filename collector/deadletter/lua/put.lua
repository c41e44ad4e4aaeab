-- Upsert entries (an entry seen again after its resolution is open again).
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  events maxlen
-- ARGV[4..] 24 values per entry, in the order put() sends them (named below)
-- Returns how many ids were new.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
-- an entry's values, by offset from its first (the order of RedisDeadLetterStore.put)
local ID, SOURCE, URL, STAGE, CLASS, MESSAGE, ATTEMPTS = 0, 1, 2, 3, 4, 5, 6
local FIRST_SEEN, LAST_SEEN, RECORD_KEY, PAYLOAD, FAILED = 7, 8, 9, 10, 11
local FLOW_RUN_ID, HAS_FLOW_RUN_ID, STATUS, RESOLUTION, HAS_RESOLUTION = 12, 13, 14, 15, 16
local CODEC, EVENT, CAUSE, RESOLUTION_KIND, TRACE_ID, URL_DIGEST = 17, 18, 19, 20, 21, 22
local SPAN_ID = 23
local VALUES = 24
local new = 0
for i = 4, #ARGV, VALUES do
  local function v(name) return ARGV[i + name] end
  local id = v(ID)
  local key = P .. id
  local last = v(LAST_SEEN)
  local cur = current(key)
  local src = v(SOURCE)
  local stage, cls, cause = v(STAGE), v(CLASS), v(CAUSE)
  local lab = label(stage, cause, cls)
  if not cur then
    new = new + 1
    local st = v(STATUS)
    redis.call('HSET', key, 'id', id, 'source', src, 'url', v(URL), 'stage', stage,
               'error_class', cls, 'message', v(MESSAGE), 'attempts', v(ATTEMPTS),
               'first_seen', v(FIRST_SEEN), 'last_seen', last, 'record_key', v(RECORD_KEY),
               'payload', v(PAYLOAD), 'failed_expectations', v(FAILED),
               'codec', v(CODEC), 'status', st, 'cause', cause, 'trace_id', v(TRACE_ID),
               'url_digest', v(URL_DIGEST), 'span_id', v(SPAN_ID), 'v', '2')
    if v(HAS_FLOW_RUN_ID) == '1' then redis.call('HSET', key, 'flow_run_id', v(FLOW_RUN_ID)) end
    if v(HAS_RESOLUTION) == '1' then redis.call('HSET', key, 'resolution', v(RESOLUTION)) end
    if v(RESOLUTION_KIND) ~= '' then
      redis.call('HSET', key, 'resolution_kind', v(RESOLUTION_KIND))
    end
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage), id)
    redis.call('SADD', P .. 'ix:stage:' .. esc(stage) .. ':' .. esc(src), id)
    redis.call('SADD', P .. 'ix:class:' .. esc(cls), id)
    status_add(id, src, lab, st)
  else
    src = cur.src
    -- attempts across cycles (collector/deadletter/base.py): a put onto a resolved entry
    -- starts a new cycle, whose attempts add to those of the cycles before it
    local earlier = tonumber(redis.call('HGET', key, 'earlier_attempts') or '0')
    if cur.status == 'resolved' then
      earlier = tonumber(cur.attempts)
      redis.call('HSET', key, 'earlier_attempts', earlier)
    end
    local attempts = math.max(tonumber(cur.attempts), earlier + tonumber(v(ATTEMPTS)))
    redis.call('HSET', key, 'message', v(MESSAGE), 'attempts', attempts, 'last_seen', last,
               'payload', v(PAYLOAD), 'failed_expectations', v(FAILED),
               'codec', v(CODEC), 'cause', cause, 'trace_id', v(TRACE_ID),
               'url_digest', v(URL_DIGEST), 'span_id', v(SPAN_ID))
    if v(HAS_FLOW_RUN_ID) == '1' then
      redis.call('HSET', key, 'flow_run_id', v(FLOW_RUN_ID))
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
  event(ARGV[3], 'quarantined', id, v(EVENT))
end
return remember(new)
