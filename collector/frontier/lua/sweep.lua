-- ARGV: run_id, '1' to retire (else collect). After a full plan, every queued or leased item
-- not tagged with the run is one the seed list no longer names: it is tagged with the run and
-- marked unlisted; with retire, queued ones leave the queue for the retired state. Done and
-- expired items not tagged are marked unlisted too (not counted). Returns carried, retired.
local run = run_number(ARGV[1])
local retire = ARGV[2] == '1'
local carried, retired = 0, 0
each_member(K_L, function(url)
  local rec, k, f = load(url)
  if rec and rec[1] == L and rec[2] ~= run then
    bump(rec[2], L, -1); bump(run, L, 1)
    rec[2], rec[14] = run, 1
    save(k, f, rec)
    carried = carried + 1
  end
  return false
end)
for _, key in ipairs({K_Q, K_D}) do
  each_member(key, function(url)
    local rec, k, f = load(url)
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
  end)
end
-- done and expired items the list no longer names leave the due index (an unchanged plan must
-- not queue them again); they are not this run's business, so they keep their run
for _, index in ipairs({{K_F, D}, {K_E, E}}) do
  each_member(index[1], function(url)
    local rec, k, f = load(url)
    if rec and rec[1] == index[2] and rec[2] == run then return false end
    if rec and rec[1] == index[2] then
      rec[14] = 1
      save(k, f, rec)
    end
    redis.call('ZREM', index[1], url)
    return true
  end)
end
flush_counts()
return {carried, retired}
