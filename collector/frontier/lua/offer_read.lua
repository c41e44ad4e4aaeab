-- The read half of an offer: what each url's record says now.
-- KEYS[1]  B: the source's base {<prefix>:<source>} (prelude)
-- ARGV[1]  a JSON array of urls
-- ARGV[2]  run_id
-- Returns a JSON array of, per url: the sha1 of its record ('' for none: the version the apply
-- script checks), state, fresh_until, last_fetched_at (exact text), 1 when the record is tagged
-- with run_id (else 0).
local run = tonumber(redis.call('HGET', K_RUNS, ARGV[2]) or '-1')
local out = {}
for _, url in ipairs(cjson.decode(ARGV[1])) do
  local rec, _, _, raw = load(url)
  if rec then
    out[#out + 1] = redis.sha1hex(raw)
    out[#out + 1] = rec[F_STATE]
    out[#out + 1] = rec[F_FRESH_UNTIL] and fmt(rec[F_FRESH_UNTIL]) or ''
    out[#out + 1] = rec[F_LAST_FETCHED_AT] and fmt(rec[F_LAST_FETCHED_AT]) or ''
    out[#out + 1] = rec[F_RUN] == run and 1 or 0
  else
    out[#out + 1] = ''; out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = ''
    out[#out + 1] = 0
  end
end
return cjson.encode(out)
