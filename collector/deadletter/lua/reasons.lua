-- ARGV[3] source, then the statuses to read. Returns one flat HGETALL per status.
local out = {}
for i = 4, #ARGV do
  out[#out + 1] = redis.call('HGETALL', P .. 'ix:reasons:' .. esc(ARGV[i]) .. ':' .. esc(ARGV[3]))
end
return out
