-- Dead or expired items are queued again.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  now
-- ARGV[2]  expires_at
-- ARGV[3..] urls
-- Returns how many were queued again.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local now, exp = tonumber(ARGV[1]), tonumber(ARGV[2])
local requeued = 0
for i = 3, #ARGV do
  local url = ARGV[i]
  local rec, k, f = load(url)
  if rec and (rec[F_STATE] == X or rec[F_STATE] == E) then
    if rec[F_STATE] == E then redis.call('ZREM', K_E, url) end
    rec[F_NOT_BEFORE], rec[F_ATTEMPTS], rec[F_FIRST_ATTEMPT_AT] = nil, nil, nil
    rec[F_ENQUEUED_AT], rec[F_EXPIRES_AT] = now, exp
    clear_error(url, rec)
    move(rec, Q); enter_queue(url, rec, now); save(k, f, rec)
    requeued = requeued + 1
  end
end
flush_expiry()
flush_counts()
return remember(requeued)
