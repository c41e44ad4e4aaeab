-- Shared by every script: ARGV[1] is the key prefix "{prefix}:dl:", ARGV[2] the epoch token,
-- KEYS[1] the meta key. The epoch check runs before any write.
local P = ARGV[1]
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then
  return redis.error_reply('DLLOST the dead-letter data this store was using is gone')
end
local function esc(s)
  return (string.gsub(string.gsub(s, '%%', '%%25'), ':', '%%3A'))
end
local function status_add(id, src, stage, cls, st)
  redis.call('SADD', P .. 'ix:status:' .. esc(st), id)
  redis.call('SADD', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  redis.call('HINCRBY', P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src), stage .. '/' .. cls, 1)
end
local function status_rem(id, src, stage, cls, st)
  redis.call('SREM', P .. 'ix:status:' .. esc(st), id)
  redis.call('SREM', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  local rk = P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src)
  local field = stage .. '/' .. cls
  if redis.call('HINCRBY', rk, field, -1) <= 0 then redis.call('HDEL', rk, field) end
end
local function move(id, src, stage, cls, from, to)
  status_rem(id, src, stage, cls, from)
  status_add(id, src, stage, cls, to)
end
local function event(maxlen, name, id, data)
  redis.call('XADD', P .. 'events', 'MAXLEN', '~', maxlen, '*',
             'event', name, 'id', id, 'data', data)
end
local function forget_review(key, msg)
  if msg then
    redis.pcall('XACK', P .. 'review', 'reviewers', msg)
    redis.call('XDEL', P .. 'review', msg)
  end
  redis.call('HDEL', key, 'review_msg', 'review_reason')
end
