-- Extend a lease.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  token: the lease's fencing token
-- ARGV[2]  lease_expires
-- ARGV[3..] urls of the lease
-- Returns how many were renewed.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local token = tonumber(ARGV[1])
local renewed = 0
for i = 3, #ARGV do
  local rec = load(ARGV[i])
  if rec and rec[F_STATE] == L and rec[F_LEASE_TOKEN] == token then
    redis.call('ZADD', K_L, ARGV[2], ARGV[i])
    renewed = renewed + 1
  end
end
return remember(renewed)
