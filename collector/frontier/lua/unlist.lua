-- ARGV: run_id, '1' to retire (else collect), a JSON array of urls that left the seed list. Each
-- is settled as sweep settles an item the list no longer names: queued or leased and not the
-- run's -> tagged with it and marked unlisted (queued ones retired with retire); done or expired
-- -> marked unlisted and out of the due index. Others are left alone. Returns carried, retired.
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local run = run_number(ARGV[1])
local retire = ARGV[2] == '1'
local carried, retired = 0, 0
for _, url in ipairs(cjson.decode(ARGV[3])) do
  local rec, k, f = load(url)
  if rec and rec[2] ~= run then
    local state = rec[1]
    if state == L or (state == Q and not retire) then
      bump(rec[2], state, -1); bump(run, state, 1)
      rec[2], rec[14] = run, 1
      save(k, f, rec)
      carried = carried + 1
    elseif state == Q then
      leave_queue(url, rec)
      bump(rec[2], Q, -1); bump(run, R, 1)
      rec[1], rec[2], rec[3], rec[14] = R, run, nil, 1
      save(k, f, rec)
      retired = retired + 1
    elseif (state == D or state == E) and not rec[14] then
      rec[14] = 1
      save(k, f, rec)
      redis.call('ZREM', state == D and K_F or K_E, url)
    end
  end
end
flush_counts()
return remember({carried, retired})
