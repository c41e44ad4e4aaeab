-- Dead items become done as if acked Completed.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  a JSON array of url, fresh_until, fetched_at, cost per page (numbers as exact text)
-- Returns how many were dead.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local A = cjson.decode(ARGV[1])
local revived = 0
for i = 1, #A, 4 do
  local url = A[i]
  local rec, k, f = load(url)
  if rec and rec[F_STATE] == X then
    rec[F_FRESH_UNTIL] = tonumber(A[i + 1])
    rec[F_LAST_FETCHED_AT] = tonumber(A[i + 2])
    rec[F_COST] = nz(tonumber(A[i + 3]))
    rec[F_NOT_BEFORE], rec[F_ATTEMPTS], rec[F_FIRST_ATTEMPT_AT] = nil, nil, nil
    clear_error(url, rec)
    set_validators(k, f, false, false)  -- the sink holds a repaired record, not this page
    move(rec, D); save(k, f, rec)
    redis.call('ZADD', K_F, fmt(rec[F_FRESH_UNTIL]), url)  -- the due index
    revived = revived + 1
  end
end
flush_counts()
return remember(revived)
