-- Settle a lease's outcomes: done, queued again for a retry, or dead.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  token: the lease's fencing token
-- ARGV[2]  now
-- ARGV[3]  outcomes: one JSON array (one argument: cheaper to send and to read than thousands)
--          of, per outcome, 'c' url fresh_until fetched_at cost etag last_modified history
--                             ('' none; a history '' keeps the kept one)
--                         | 'r' url not_before rank attempts first_attempt_at error
--                         | 'd' url attempts error   (numbers as text, so they stay exact)
-- Returns accepted, then the 1-based positions of stale outcomes.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local token, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local A = cjson.decode(ARGV[3])
local i, n, accepted = 1, 0, 0
local out = {0}
local released = {}
while i <= #A do
  local kind, url = A[i], A[i + 1]
  n = n + 1
  local rec, k, f = load(url)
  local held = rec and rec[F_STATE] == L and rec[F_LEASE_TOKEN] == token
  if held then
    rec[F_LEASE_TOKEN] = nil
    if kind == 'c' then
      rec[F_FRESH_UNTIL] = tonumber(A[i + 2])
      rec[F_LAST_FETCHED_AT] = tonumber(A[i + 3])
      rec[F_COST] = nz(tonumber(A[i + 4]))
      rec[F_ATTEMPTS], rec[F_FIRST_ATTEMPT_AT] = nil, nil
      move(rec, D)
      redis.call('ZADD', K_F, fmt(rec[F_FRESH_UNTIL]), url)
      clear_error(url, rec)
      set_validators(k, f, A[i + 5] ~= '' and A[i + 5], A[i + 6] ~= '' and A[i + 6])
      if A[i + 7] ~= '' then redis.call('HSET', K_HIST, url, A[i + 7]) end
    elseif kind == 'r' then
      local nb = tonumber(A[i + 2])
      rec[F_NOT_BEFORE], rec[F_RANK] = nz(nb), tonumber(A[i + 3])
      rec[F_ATTEMPTS], rec[F_FIRST_ATTEMPT_AT] = nz(tonumber(A[i + 4])), tonumber(A[i + 5])
      rec[F_EXPIRES_AT] = math.max(rec[F_EXPIRES_AT], nb + (rec[F_EXPIRES_AT] - rec[F_ENQUEUED_AT]))
      set_error(url, rec, A[i + 6])
      move(rec, Q)
      enter_queue(url, rec, now)
    else
      rec[F_ATTEMPTS] = nz(tonumber(A[i + 2]))
      set_error(url, rec, A[i + 3])
      move(rec, X)
    end
    save(k, f, rec)
    released[#released + 1] = url
    accepted = accepted + 1
  else
    out[#out + 1] = n
  end
  if kind == 'c' then i = i + 8 elseif kind == 'r' then i = i + 7 else i = i + 4 end
end
if #released > 0 then bulk('ZREM', K_L, released, 1000) end
flush_expiry()
flush_counts()
out[1] = accepted
return remember(out)
