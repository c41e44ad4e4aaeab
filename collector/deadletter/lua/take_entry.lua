-- Hand the review of one escalated entry to a reviewer, whatever its place in the stream.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- KEYS[2]  the call's reply record (a replayed script: collector/_redis.py)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  source
-- ARGV[4]  entry id
-- ARGV[5]  reviewer
-- ARGV[6]  idle ms past which a review held by someone else is taken over (-1: never)
-- Returns the message id the reviewer now holds, 'held' when another reviewer holds it (not idle
-- long enough), or false when the entry is not in review in this source.
--
-- A consumer group delivers only in stream order, so a waiting message cannot be delivered out
-- of turn. Instead it is replaced by a new message at the end, put in the reviewer's pending
-- list (XCLAIM FORCE), and the group's last-delivered id moved to it (so `>` never hands it to
-- anyone else); the messages that were waiting before it are re-added after it, in their order,
-- so nobody's place is lost. Cost: the messages waiting (a human-sized queue).
local again = replayed()  -- a resend of a call that ran: its reply, nothing runs again
if again ~= nil then return again end
local src, id, reviewer, idle = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local key = P .. id
local cur = current(key)
if not cur or cur.src ~= src or cur.status ~= 'review' or not cur.msg then return false end
local stream = rkey(src)
local pending = redis.call('XPENDING', stream, 'reviewers', cur.msg, cur.msg, 1)
if #pending > 0 then
  local holder, held_ms = pending[1][2], tonumber(pending[1][3])
  if holder ~= reviewer and (idle < 0 or held_ms < idle) then return 'held' end
  redis.call('XCLAIM', stream, 'reviewers', reviewer, 0, cur.msg, 'JUSTID')
  return remember(cur.msg)
end
-- Waiting (not delivered yet): the group's last-delivered id says where `>` reads from.
local last = '0-0'
for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, delivered = nil, nil
  for j = 1, #group, 2 do
    if group[j] == 'name' then name = group[j + 1] end
    if group[j] == 'last-delivered-id' then delivered = group[j + 1] end
  end
  if name == 'reviewers' then last = delivered end
end
local waiting = redis.call('XRANGE', stream, '(' .. last, '+')
local new = redis.call('XADD', stream, '*', 'entry', id, 'reason', cur.reason or '')
redis.call('XDEL', stream, cur.msg)
redis.call('HSET', key, 'review_msg', new)
redis.call('XCLAIM', stream, 'reviewers', reviewer, 0, new, 'FORCE', 'JUSTID')
redis.call('XGROUP', 'SETID', stream, 'reviewers', new)
for _, message in ipairs(waiting) do
  local msg, fields, entry, reason = message[1], message[2], nil, ''
  for j = 1, #fields, 2 do
    if fields[j] == 'entry' then entry = fields[j + 1] end
    if fields[j] == 'reason' then reason = fields[j + 1] end
  end
  if msg ~= cur.msg then
    redis.call('XDEL', stream, msg)
    if entry and redis.call('HGET', P .. entry, 'review_msg') == msg then
      local moved = redis.call('XADD', stream, '*', 'entry', entry, 'reason', reason)
      redis.call('HSET', P .. entry, 'review_msg', moved)
    end
  end
end
return remember(new)
