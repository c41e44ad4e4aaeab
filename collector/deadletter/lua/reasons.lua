-- Entries per reason (stage/cause:class) of a source, per status.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  source
-- ARGV[4..] the statuses to read
-- Returns one flat HGETALL per status.
local out = {}
for i = 4, #ARGV do
  out[#out + 1] = redis.call('HGETALL', P .. 'ix:reasons:' .. esc(ARGV[i]) .. ':' .. esc(ARGV[3]))
end
return out
