-- ARGV: now, expires_at, urls. Returns how many dead or expired items were queued again.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local now, exp = tonumber(ARGV[1]), tonumber(ARGV[2])
local requeued = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and (rec[1] == X or rec[1] == E) then
    if rec[1] == E then redis.call('ZREM', K_E, url) end
    rec[6], rec[7], rec[8] = nil, nil, nil
    rec[4], rec[5] = now, exp
    clear_error(url, rec)
    move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    requeued = requeued + 1
  end
end
flush_expiry()
flush_counts()
return remember(requeued)
