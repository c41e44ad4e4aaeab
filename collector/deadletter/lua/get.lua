-- ARGV[3] id. Returns the entry hash (empty when missing).
return redis.call('HGETALL', P .. ARGV[3])
