-- ARGV: now, expires_at, run_id, and a JSON array of, per url: action ('n' enqueue, 'r' requeue,
-- 't' tag), url, the version read ('' for none), queue score = -rank ('' for tags). A url whose
-- record is no longer the version that was read is left alone; returns the 1-based positions of
-- those.
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
    save(k, f, {Q, run, false, now, exp})
    queued[#queued + 1] = A[i + 3]
    queued[#queued + 1] = url
    push_expiry(url, exp)
  else
    local rec = cmsgpack.unpack(raw)
    if action == 'r' then
      if rec[1] == D then redis.call('ZREM', K_F, url)
      elseif rec[1] == E then redis.call('ZREM', K_E, url) end
      bump(rec[2], rec[1], -1); bump(run, Q, 1)
      rec[1], rec[2], rec[3], rec[4], rec[5] = Q, run, false, now, exp
      rec[6], rec[7], rec[8], rec[9], rec[14] = nil, nil, nil, nil, nil
      clear_error(url, rec)
      save(k, f, rec)
      queued[#queued + 1] = A[i + 3]
      queued[#queued + 1] = url
      push_expiry(url, exp)
    elseif rec[2] ~= run or rec[14] then
      bump(rec[2], rec[1], -1); bump(run, rec[1], 1)
      rec[2] = run
      if rec[14] then
        rec[14] = nil  -- listed again
        if rec[1] == D then redis.call('ZADD', K_F, rec[10] and fmt(rec[10]) or '-inf', url) end
      end
      save(k, f, rec)
    end
  end
end
if #queued > 0 then bulk('ZADD', K_Q, queued, 1000) end
flush_expiry()
flush_counts()
return remember(conflicts)
