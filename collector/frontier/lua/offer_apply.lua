-- The write half of an offer: queue, requeue or tag the urls offer_read read, unless their
-- record changed since.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  now
-- ARGV[2]  expires_at
-- ARGV[3]  run_id
-- ARGV[4]  a JSON array of, per url: action ('n' enqueue, 'r' requeue, 't' tag), url, the
--          version read ('' for none), queue score = -rank ('' for tags)
-- A url whose record is no longer the version that was read is left alone. Returns the 1-based
-- positions of those.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local now, exp = tonumber(ARGV[1]), tonumber(ARGV[2])
local run = run_number(ARGV[3])
local A = cjson.decode(ARGV[4])
local conflicts = {}
local queued = {}
local n = 0
for i = 1, #A, 4 do
  local action, url, seen = A[i], A[i + 1], A[i + 2]
  n = n + 1
  local k, f = loc(url)
  local raw = redis.call('HGET', k, f)
  if (raw and redis.sha1hex(raw) or '') ~= seen then
    conflicts[#conflicts + 1] = n
  elseif action == 'n' then
    bump(run, Q, 1)
    save(k, f, {[F_STATE] = Q, [F_RUN] = run, [F_RANK] = false, [F_ENQUEUED_AT] = now,
                [F_EXPIRES_AT] = exp})
    queued[#queued + 1] = A[i + 3]
    queued[#queued + 1] = url
    push_expiry(url, exp)
  else
    local rec = cmsgpack.unpack(raw)
    if action == 'r' then
      if rec[F_STATE] == D then redis.call('ZREM', K_F, url)
      elseif rec[F_STATE] == E then redis.call('ZREM', K_E, url) end
      bump(rec[F_RUN], rec[F_STATE], -1); bump(run, Q, 1)
      rec[F_STATE], rec[F_RUN], rec[F_RANK] = Q, run, false
      rec[F_ENQUEUED_AT], rec[F_EXPIRES_AT] = now, exp
      rec[F_NOT_BEFORE], rec[F_ATTEMPTS], rec[F_FIRST_ATTEMPT_AT] = nil, nil, nil
      rec[F_LEASE_TOKEN], rec[F_UNLISTED] = nil, nil
      clear_error(url, rec)
      save(k, f, rec)
      queued[#queued + 1] = A[i + 3]
      queued[#queued + 1] = url
      push_expiry(url, exp)
    elseif rec[F_RUN] ~= run or rec[F_UNLISTED] then
      bump(rec[F_RUN], rec[F_STATE], -1); bump(run, rec[F_STATE], 1)
      rec[F_RUN] = run
      if rec[F_UNLISTED] then
        rec[F_UNLISTED] = nil  -- listed again
        if rec[F_STATE] == D then
          local due = rec[F_FRESH_UNTIL] and fmt(rec[F_FRESH_UNTIL]) or '-inf'
          redis.call('ZADD', K_F, due, url)
        end
      end
      save(k, f, rec)
    end
  end
end
if #queued > 0 then bulk('ZADD', K_Q, queued, 1000) end
flush_expiry()
flush_counts()
return remember(conflicts)
