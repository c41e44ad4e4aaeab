-- Urls that left the seed list are settled as sweep settles an item the list no longer names:
-- queued or leased and not the run's -> tagged with it and marked unlisted (queued ones retired
-- with retire); done or expired -> marked unlisted and out of the due index. Others are left
-- alone.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  run_id
-- ARGV[2]  '1' to retire (else collect)
-- ARGV[3]  a JSON array of urls that left the seed list
-- Returns carried, retired.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local run = run_number(ARGV[1])
local retire = ARGV[2] == '1'
local carried, retired = 0, 0
for _, url in ipairs(cjson.decode(ARGV[3])) do
  local rec, k, f = load(url)
  if rec and rec[F_RUN] ~= run then
    local state = rec[F_STATE]
    if state == L or (state == Q and not retire) then
      bump(rec[F_RUN], state, -1); bump(run, state, 1)
      rec[F_RUN], rec[F_UNLISTED] = run, 1
      save(k, f, rec)
      carried = carried + 1
    elseif state == Q then
      leave_queue(url, rec)
      bump(rec[F_RUN], Q, -1); bump(run, R, 1)
      rec[F_STATE], rec[F_RUN], rec[F_RANK], rec[F_UNLISTED] = R, run, nil, 1
      save(k, f, rec)
      retired = retired + 1
    elseif (state == D or state == E) and not rec[F_UNLISTED] then
      rec[F_UNLISTED] = 1
      save(k, f, rec)
      redis.call('ZREM', state == D and K_F or K_E, url)
    end
  end
end
flush_counts()
return remember({carried, retired})
