-- Shared by every script: ARGV[1] is the key prefix "{prefix}:dl:", ARGV[2] the epoch token,
-- KEYS[1] the meta key. The epoch check runs before any write. Redis runs each script as one
-- chunk: collector/_redis.py's REPLAY_LUA, this file, then the script's file, so a script reads
-- the names below as locals (.luacheckrc says so to luacheck).
local P = ARGV[1]
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then
  return redis.error_reply('DLLOST the dead-letter data this store was using is gone')
end
local function esc(s)
  return (string.gsub(string.gsub(s, '%%', '%%25'), ':', '%%3A'))
end
-- how a failure is grouped in reasons (collector.deadletter.base.reason_label)
local function label(stage, cause, cls)
  if cause and cause ~= '' then return stage .. '/' .. cause .. ':' .. cls end
  return stage .. '/' .. cls
end
-- the review stream of a source (consumer group 'reviewers')
local function rkey(src) return P .. 'review:' .. esc(src) end
-- an entry's current state, or nil when it does not exist
local function current(key)
  local c = redis.call('HMGET', key, 'source', 'stage', 'error_class', 'status', 'review_msg',
                       'cause', 'attempts', 'review_reason')
  if not c[1] then return nil end
  return {src = c[1], stage = c[2], status = c[4], msg = c[5], attempts = c[7],
          reason = c[8], lab = label(c[2], c[6], c[3])}
end
local function status_add(id, src, lab, st)
  redis.call('SADD', P .. 'ix:status:' .. esc(st), id)
  redis.call('SADD', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  redis.call('HINCRBY', P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src), lab, 1)
end
local function status_rem(id, src, lab, st)
  redis.call('SREM', P .. 'ix:status:' .. esc(st), id)
  redis.call('SREM', P .. 'ix:status:' .. esc(st) .. ':' .. esc(src), id)
  local rk = P .. 'ix:reasons:' .. esc(st) .. ':' .. esc(src)
  if redis.call('HINCRBY', rk, lab, -1) <= 0 then redis.call('HDEL', rk, lab) end
end
local function move(id, src, lab, from, to)
  status_rem(id, src, lab, from)
  status_add(id, src, lab, to)
end
local function event(maxlen, name, id, data)
  redis.call('XADD', P .. 'events', 'MAXLEN', '~', maxlen, '*',
             'event', name, 'id', id, 'data', data)
end
local function drop_message(src, msg)
  redis.pcall('XACK', rkey(src), 'reviewers', msg)
  redis.call('XDEL', rkey(src), msg)
end
local function forget_review(key, src, msg)
  if msg then drop_message(src, msg) end
  redis.call('HDEL', key, 'review_msg', 'review_reason')
end
-- an error when message msg of src's stream is about another entry than id
local function check_message(src, msg, id)
  local found = redis.call('XRANGE', rkey(src), msg, msg)
  if #found > 0 then
    local fields, entry = found[1][2], nil
    for j = 1, #fields, 2 do if fields[j] == 'entry' then entry = fields[j + 1] end end
    if entry ~= id then
      return 'DLMISMATCH review message ' .. msg .. ' is for entry ' .. tostring(entry)
             .. ', not ' .. id
    end
  end
  return nil
end
