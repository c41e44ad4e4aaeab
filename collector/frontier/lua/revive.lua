-- ARGV: a JSON array of url, fresh_until, fetched_at, cost per page (numbers as exact text).
-- Dead items become done as if acked Completed. Returns how many were dead.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local A = cjson.decode(ARGV[1])
local revived = 0
for i = 1, #A, 4 do
  local url = A[i]
  local rec, k, f = load(url)
  if rec and rec[1] == X then
    rec[10], rec[11], rec[12] = tonumber(A[i + 1]), tonumber(A[i + 2]), nz(tonumber(A[i + 3]))
    rec[6], rec[7], rec[8] = nil, nil, nil
    clear_error(url, rec)
    move(rec, D); save(k, f, rec)
    redis.call('ZADD', K_F, fmt(rec[10]), url)  -- the due index
    revived = revived + 1
  end
end
flush_counts()
return remember(revived)
