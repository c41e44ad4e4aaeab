-- Layout 1 -> 2 for some entries (idempotent: a migrated entry has v = 2). Layout 1 encoded
-- the cause in error_class ('retries_exhausted:http_500') and the resolution kind in its text
-- ('repaired: trimmed'), and kept every review message in one stream P .. 'review'; the caller
-- deletes that stream after the last chunk.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3..] entry ids
-- Returns how many entries changed.
local causes = {retries_exhausted = true, max_total_exceeded = true}
local kinds = {repaired = true, reenqueued = true, escalated = true, discarded = true,
               reviewed = true}
local changed = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = P .. id
  local c = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'resolution',
                       'resolution_kind', 'review_msg', 'review_reason', 'v')
  if c[1] and c[9] ~= '2' then
    local src, stage, cls, st = c[1], c[2], c[3], c[4]
    local head, final = string.match(cls, '^(.*):([^:]*)$')
    local cause = ''
    if final then
      if causes[head] then cause = head end
      redis.call('SREM', P .. 'ix:class:' .. esc(cls), id)
      redis.call('SADD', P .. 'ix:class:' .. esc(final), id)
    else
      final = cls
    end
    local old, lab = stage .. '/' .. cls, label(stage, cause, final)
    if old ~= lab then
      status_rem(id, src, old, st)
      status_add(id, src, lab, st)
    end
    redis.call('HSET', key, 'error_class', final, 'v', '2')
    if final ~= cls then redis.call('HSET', key, 'cause', cause) end
    if st == 'resolved' and not c[6] and c[5] then
      local kind, rest = string.match(c[5], '^%s*([^:]-)%s*:%s*(.-)%s*$')
      if kind and kinds[kind] then
        redis.call('HSET', key, 'resolution_kind', kind, 'resolution', rest)
      end
    end
    if st == 'review' and c[7] then
      local msg = redis.call('XADD', rkey(src), '*', 'entry', id, 'reason', c[8] or '')
      redis.call('HSET', key, 'review_msg', msg)
    end
    changed = changed + 1
  end
end
return changed
