-- Entries per status, of the store or of one source.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  '1' with a source, else '0'
-- ARGV[4]  the source (with '1')
-- Returns open, review, resolved counts.
local tail = ''
if ARGV[3] == '1' then tail = ':' .. esc(ARGV[4]) end
return {redis.call('SCARD', P .. 'ix:status:open' .. tail),
        redis.call('SCARD', P .. 'ix:status:review' .. tail),
        redis.call('SCARD', P .. 'ix:status:resolved' .. tail)}
