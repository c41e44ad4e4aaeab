-- One entry.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  entry id
-- Returns the entry hash (empty when missing).
return redis.call('HGETALL', P .. ARGV[3])
