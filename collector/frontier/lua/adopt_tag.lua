-- ARGV: run_id. An unchanged plan: every queued or leased item joins the run (tagged with it).
-- Returns how many were tagged (those already the run's are not counted).
local run = run_number(ARGV[1])
local tagged = 0
for _, key in ipairs({K_L, K_Q, K_D}) do
  local state = key == K_L and L or Q
  each_member(key, function(url)
    local rec, k, f = load(url)
    if rec and rec[1] == state and rec[2] ~= run then
      bump(rec[2], state, -1); bump(run, state, 1)
      rec[2] = run
      save(k, f, rec)
      tagged = tagged + 1
    end
    return false
  end)
end
flush_counts()
return tagged
