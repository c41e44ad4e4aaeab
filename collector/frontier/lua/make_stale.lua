-- ARGV: urls. Returns how many done items lost their freshness (the next plan queues them).
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local stale = 0
for i = 1, #ARGV do
  local rec, k, f = load(ARGV[i])
  if rec and rec[1] == D then
    rec[10] = nil; save(k, f, rec)
    redis.call('ZADD', K_F, '-inf', ARGV[i])  -- due at once
    stale = stale + 1
  end
end
return remember(stale)
