-- Up to limit urls of listed items that are due: expired ones, and done ones whose
-- fresh_until has passed (the due index; make_stale puts them at -inf).
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV[1]  now
-- ARGV[2]  limit
-- ARGV[3]  run_id: items already tagged with the run are passed over (they are its already)
-- Index entries of items that moved on, or that no seed list names any more, are dropped here.
-- The urls returned stay indexed until the offer that requeues them removes them. Returns a
-- JSON array.
local now_s, limit = ARGV[1], tonumber(ARGV[2])
local run = tonumber(redis.call('HGET', K_RUNS, ARGV[3]) or '-1')
local out = {}
local skip = 0
local function pick(key, state, page)
  local gone = {}
  for _, url in ipairs(page) do
    local rec = load(url)
    if rec and rec[F_STATE] == state and not rec[F_UNLISTED] then
      if rec[F_RUN] == run then skip = skip + 1 else out[#out + 1] = url end
    else
      gone[#gone + 1] = url
    end
  end
  if #gone > 0 then bulk('ZREM', key, gone, 1000) end
end
-- a page of stale entries only is dropped and the next page read; one with due items ends it
for _, index in ipairs({{K_E, E, '+inf'}, {K_F, D, now_s}}) do
  skip = 0
  while #out == 0 do
    local page = redis.call('ZRANGEBYSCORE', index[1], '-inf', index[3], 'LIMIT', skip, limit)
    if #page == 0 then break end
    pick(index[1], index[2], page)
  end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
