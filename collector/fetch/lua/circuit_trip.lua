-- Open (or re-open) a host's circuit breaker unless another worker already did since the
-- caller's epoch (collector/fetch/circuit.py RedisCircuitStore.trip).
-- KEYS[1]  the host's hash (epoch, opens, until)
-- ARGV[1]  seen_epoch: the epoch the caller saw
-- ARGV[2]  now
-- ARGV[3]  draw: a uniform random number in [0, 1) for the jitter
-- ARGV[4]  cooldown_s: the first open's cooldown
-- ARGV[5]  factor: each further open's cooldown grows by it
-- ARGV[6]  max_s: the longest cooldown
-- ARGV[7]  jitter: the cooldown varies by this share either way
-- ARGV[8]  ttl_s: the hash outlives its cooldown by this
-- Returns {epoch, opens, until, opened (1 when this call opened it)}.
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local opens = tonumber(redis.call('HGET', KEYS[1], 'opens') or '0')
if epoch ~= tonumber(ARGV[1]) then
  return {epoch, opens, redis.call('HGET', KEYS[1], 'until') or '0', 0}
end
opens = opens + 1
local cool = tonumber(ARGV[4]) * tonumber(ARGV[5]) ^ (opens - 1)
cool = math.min(cool, tonumber(ARGV[6])) * (1 + tonumber(ARGV[7]) * (2 * tonumber(ARGV[3]) - 1))
local until_ = tostring(tonumber(ARGV[2]) + cool)
redis.call('HSET', KEYS[1], 'epoch', epoch + 1, 'opens', opens, 'until', until_)
redis.call('PEXPIRE', KEYS[1], math.floor((cool + tonumber(ARGV[8])) * 1000))
return {epoch + 1, opens, until_, 1}
