-- Done items lose their freshness (and validators): the next plan queues them.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1..] urls
-- Returns how many done items lost their freshness.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local stale = 0
for i = 1, #ARGV do
  local rec, k, f = load(ARGV[i])
  if rec and rec[F_STATE] == D then
    rec[F_FRESH_UNTIL] = nil; save(k, f, rec)
    set_validators(k, f, false, false)  -- its records are gone: the next fetch is a plain one
    redis.call('ZADD', K_F, '-inf', ARGV[i])  -- due at once
    stale = stale + 1
  end
end
return remember(stale)
