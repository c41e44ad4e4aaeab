-- ARGV: token, now, and one JSON array (one argument: cheaper to send and to read than thousands)
-- of, per outcome, 'c' url fresh_until fetched_at cost
--                | 'r' url not_before rank attempts first_attempt_at error
--                | 'd' url attempts error      (numbers as text, so they stay exact)
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
  local held = rec and rec[1] == L and rec[9] == token
  if held then
    rec[9] = nil
    if kind == 'c' then
      rec[10], rec[11], rec[12] = tonumber(A[i + 2]), tonumber(A[i + 3]),
        nz(tonumber(A[i + 4]))
      rec[7], rec[8] = nil, nil
      move(rec, D)
      redis.call('ZADD', K_F, fmt(rec[10]), url)
      clear_error(url, rec)
    elseif kind == 'r' then
      local nb = tonumber(A[i + 2])
      rec[6], rec[3] = nz(nb), tonumber(A[i + 3])
      rec[7], rec[8] = nz(tonumber(A[i + 4])), tonumber(A[i + 5])
      rec[5] = math.max(rec[5], nb + (rec[5] - rec[4]))
      set_error(url, rec, A[i + 6])
      move(rec, Q)
      enter_queue(url, rec, now)
    else
      rec[7] = nz(tonumber(A[i + 2]))
      set_error(url, rec, A[i + 3])
      move(rec, X)
    end
    save(k, f, rec)
    released[#released + 1] = url
    accepted = accepted + 1
  else
    out[#out + 1] = n
  end
  if kind == 'c' then i = i + 5 elseif kind == 'r' then i = i + 7 else i = i + 4 end
end
if #released > 0 then bulk('ZREM', K_L, released, 1000) end
flush_expiry()
flush_counts()
out[1] = accepted
return remember(out)
