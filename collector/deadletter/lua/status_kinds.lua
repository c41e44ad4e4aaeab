-- ARGV[3] source. Returns {open count, review count, prefix, n, prefix, n...}: resolved entries
-- by the text before the first ':' of their resolution. O(resolved entries of the source) inside
-- Redis, one round trip, no payload leaves the server.
local src = esc(ARGV[3])
local out = {redis.call('SCARD', P .. 'ix:status:open:' .. src),
             redis.call('SCARD', P .. 'ix:status:review:' .. src)}
local kinds = {}
for _, id in ipairs(redis.call('SMEMBERS', P .. 'ix:status:resolved:' .. src)) do
  local resolution = redis.call('HGET', P .. id, 'resolution') or ''
  local kind = string.match(resolution, '^([^:]*)')
  kinds[kind] = (kinds[kind] or 0) + 1
end
for kind, n in pairs(kinds) do
  table.insert(out, kind)
  table.insert(out, n)
end
return out
