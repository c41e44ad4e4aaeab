-- The counters of the source or of one run.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV[1]  '' for the source's counters, else 'run'
-- ARGV[2]  run_id (with 'run')
-- Returns the counter hash (state -> count) as field/value.
if ARGV[1] == '' then return redis.call('HGETALL', K_N) end
local run = redis.call('HGET', K_RUNS, ARGV[2])
if not run then return {} end
return redis.call('HGETALL', B .. ':rc:' .. run)
