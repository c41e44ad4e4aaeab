-- ARGV: run_id, '1' to retire (else collect), set (1 leased, 2 queued, 3 delayed), position, page
-- size. After a full plan, every queued or leased item not tagged with the run is one the seed
-- list no longer names: it is tagged with the run and marked unlisted; with retire, queued ones
-- leave the queue for the retired state. One page per call (see page_sets). Returns carried,
-- retired, the next set and position, and how many are left (exact, as in adopt_tag).
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local run = run_number(ARGV[1])
local retire = ARGV[2] == '1'
local left = not_ours(run)
local carried, retired = 0, 0
local ki, pos = page_sets({K_L, K_Q, K_D}, tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), function(url, key)
    local rec, k, f = load(url)
    if key == K_L then
      if rec and rec[1] == L and rec[2] ~= run then
        bump(rec[2], L, -1); bump(run, L, 1)
        rec[2], rec[14] = run, 1
        save(k, f, rec)
        carried = carried + 1
      end
      return false
    end
    if not rec or rec[1] ~= Q or rec[2] == run then return false end
    rec[14] = 1
    if retire then
      leave_queue(url, rec)
      bump(rec[2], Q, -1); bump(run, R, 1)
      rec[1], rec[2], rec[3] = R, run, nil
      save(k, f, rec)
      retired = retired + 1
      return true
    end
    bump(rec[2], Q, -1); bump(run, Q, 1)
    rec[2] = run
    save(k, f, rec)
    carried = carried + 1
    return false
  end, function() return carried + retired < left end)
flush_counts()
return remember({carried, retired, ki, pos, left - carried - retired})
