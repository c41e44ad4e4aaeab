-- Every entry of a source, read from the entries themselves (an index entry whose hash is gone
-- is not counted). One round trip, O(entries of the source) inside Redis, no payload leaves
-- the server.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  source
-- Returns id, status, resolution kind ('' for none) of every entry of the source.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', P .. 'ix:seen:' .. esc(ARGV[3]), 0, -1)) do
  local c = redis.call('HMGET', P .. id, 'source', 'status', 'resolution_kind')
  if c[1] == ARGV[3] then
    out[#out + 1] = id
    out[#out + 1] = c[2]
    out[#out + 1] = c[3] or ''
  end
end
return out
