-- ARGV: run_id or ''. Returns the counter hash (of the source, or of the run) as field/value.
if ARGV[1] == '' then return redis.call('HGETALL', K_N) end
local run = redis.call('HGET', K_RUNS, ARGV[2])
if not run then return {} end
return redis.call('HGETALL', B .. ':rc:' .. run)
