-- An unchanged plan: the queued and leased items not yet the run's join it (tagged with it),
-- one page per call so that Redis is never held for long (see page_sets).
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  run_id
-- ARGV[2]  set: 1 leased, 2 queued, 3 delayed
-- ARGV[3]  position in the set
-- ARGV[4]  page size
-- Returns tagged, the next set and position, and how many are left to tag (exact: the source's
-- queued and leased minus the run's).
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local run = run_number(ARGV[1])
local left = not_ours(run)
local tagged = 0
local ki, pos = page_sets({K_L, K_Q, K_D}, tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), function(url, key)
    local state = key == K_L and L or Q
    local rec, k, f = load(url)
    if rec and rec[F_STATE] == state and rec[F_RUN] ~= run then
      bump(rec[F_RUN], state, -1); bump(run, state, 1)
      rec[F_RUN] = run
      save(k, f, rec)
      tagged = tagged + 1
    end
    return false
  end, function() return tagged < left end)
flush_counts()
return remember({tagged, ki, pos, left - tagged})
