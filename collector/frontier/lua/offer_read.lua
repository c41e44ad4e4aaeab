-- ARGV: a JSON array of urls, run_id. Returns a JSON array of, per url: the sha1 of its record
-- ('' for none: the version the apply script checks), state, fresh_until, last_fetched_at (exact
-- text), 1 when the record is tagged with run_id (else 0).
local run = tonumber(redis.call('HGET', K_RUNS, ARGV[2]) or '-1')
local out = {}
for _, url in ipairs(cjson.decode(ARGV[1])) do
  local rec, _, _, raw = load(url)
  if rec then
    out[#out + 1] = redis.sha1hex(raw)
    out[#out + 1] = rec[1]
    out[#out + 1] = rec[10] and fmt(rec[10]) or ''
    out[#out + 1] = rec[11] and fmt(rec[11]) or ''
    out[#out + 1] = rec[2] == run and 1 or 0
  else
    out[#out + 1] = ''; out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = ''
    out[#out + 1] = 0
  end
end
return cjson.encode(out)
