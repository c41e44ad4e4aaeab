-- ARGV: token, lease_expires, urls of the lease. Returns how many were renewed.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local token = tonumber(ARGV[1])
local renewed = 0
for i = 3, #ARGV do
  local rec = load(ARGV[i])
  if rec and rec[1] == L and rec[9] == token then
    redis.call('ZADD', K_L, ARGV[2], ARGV[i])
    renewed = renewed + 1
  end
end
return remember(renewed)
