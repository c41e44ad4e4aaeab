-- Record that a holder is alive.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV[1]  holder
-- ARGV[2]  now
-- Returns 1.
redis.call('HSET', K_HB, ARGV[1], ARGV[2])
return 1
