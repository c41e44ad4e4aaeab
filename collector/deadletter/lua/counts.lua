-- ARGV[3] '1' with a source, ARGV[4] the source. Returns open, review, resolved counts.
local tail = ''
if ARGV[3] == '1' then tail = ':' .. esc(ARGV[4]) end
return {redis.call('SCARD', P .. 'ix:status:open' .. tail),
        redis.call('SCARD', P .. 'ix:status:review' .. tail),
        redis.call('SCARD', P .. 'ix:status:resolved' .. tail)}
