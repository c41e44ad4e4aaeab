-- ARGV: holder, now. Records that the holder is alive.
redis.call('HSET', K_HB, ARGV[1], ARGV[2])
return 1
