-- Nothing but the prelude's epoch check: DLLOST when the data is gone.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- Returns 1.
return 1
