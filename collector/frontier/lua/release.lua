-- ARGV: token, now, urls of the lease. Returns how many went back to the queue.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local token, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local released = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and rec[1] == L and rec[9] == token then
    redis.call('ZREM', K_L, url)
    rec[9] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    released = released + 1
  end
end
flush_expiry()
flush_counts()
return remember(released)
