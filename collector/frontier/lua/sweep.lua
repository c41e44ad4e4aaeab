-- After a full plan, every queued or leased item not tagged with the run is one the seed list
-- no longer names: it is tagged with the run and marked unlisted; with retire, queued ones
-- leave the queue for the retired state. One page per call (see page_sets).
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  run_id
-- ARGV[2]  '1' to retire (else collect)
-- ARGV[3]  set: 1 leased, 2 queued, 3 delayed
-- ARGV[4]  position in the set
-- ARGV[5]  page size
-- Returns carried, retired, the next set and position, and how many are left (exact, as in
-- adopt_tag).
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
      if rec and rec[F_STATE] == L and rec[F_RUN] ~= run then
        bump(rec[F_RUN], L, -1); bump(run, L, 1)
        rec[F_RUN], rec[F_UNLISTED] = run, 1
        save(k, f, rec)
        carried = carried + 1
      end
      return false
    end
    if not rec or rec[F_STATE] ~= Q or rec[F_RUN] == run then return false end
    rec[F_UNLISTED] = 1
    if retire then
      leave_queue(url, rec)
      bump(rec[F_RUN], Q, -1); bump(run, R, 1)
      rec[F_STATE], rec[F_RUN], rec[F_RANK] = R, run, nil
      save(k, f, rec)
      retired = retired + 1
      return true
    end
    bump(rec[F_RUN], Q, -1); bump(run, Q, 1)
    rec[F_RUN] = run
    save(k, f, rec)
    carried = carried + 1
    return false
  end, function() return carried + retired < left end)
flush_counts()
return remember({carried, retired, ki, pos, left - carried - retired})
