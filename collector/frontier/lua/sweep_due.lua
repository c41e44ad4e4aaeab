-- After sweep: done and expired items the list no longer names (not tagged with the run) are
-- marked unlisted and leave their index, so an unchanged plan never queues them again; they are
-- not the run's business and keep their run. One page per call (see page_sets).
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  run_id
-- ARGV[2]  set: 1 the due index of done items, 2 expired items
-- ARGV[3]  position in the set
-- ARGV[4]  page size
-- Returns the next set and position.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local run = run_number(ARGV[1])
local ki, pos = page_sets({K_F, K_E}, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  function(url, key)
    local state = key == K_F and D or E
    local rec, k, f = load(url)
    if rec and rec[F_STATE] == state and rec[F_RUN] == run then return false end
    if rec and rec[F_STATE] == state then
      rec[F_UNLISTED] = 1
      save(k, f, rec)
    end
    redis.call('ZREM', key, url)
    return true
  end, function() return true end)
return remember({ki, pos})
