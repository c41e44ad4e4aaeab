-- A lease given back unfetched: its items go back to the queue.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  token: the lease's fencing token
-- ARGV[2]  now
-- ARGV[3..] urls of the lease
-- Returns how many went back to the queue.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local token, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local released = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and rec[F_STATE] == L and rec[F_LEASE_TOKEN] == token then
    redis.call('ZREM', K_L, url)
    rec[F_LEASE_TOKEN] = nil; move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    released = released + 1
  end
end
flush_expiry()
flush_counts()
return remember(released)
