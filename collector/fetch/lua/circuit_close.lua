-- Close a host's breaker after a successful probe, if still at the probe's epoch.
-- KEYS[1]  the host's hash (epoch, opens, until)
-- ARGV[1]  the probe's epoch
-- Returns 1 when this call closed it.
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local opens = tonumber(redis.call('HGET', KEYS[1], 'opens') or '0')
if opens == 0 or epoch ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'opens', 0, 'until', '0')
return 1
