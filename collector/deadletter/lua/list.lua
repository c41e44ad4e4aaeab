-- Entries by filters, newest last_seen first, read from the indexes.
-- KEYS[1]  the store's meta key (its epoch: prelude)
-- ARGV[1]  P: the key prefix '<prefix>:dl:' (prelude)
-- ARGV[2]  the epoch this store adopted (prelude: another one means the data is gone)
-- ARGV[3]  limit (<0: no limit)
-- ARGV[4]  '1' to filter by source     ARGV[5]  the source
-- ARGV[6]  '1' to filter by stage      ARGV[7]  the stage
-- ARGV[8]  '1' to filter by class      ARGV[9]  the error class
-- ARGV[10] '1' to filter by status     ARGV[11] the status
-- ARGV[12] candidates: a filter set at most this large is read whole, else the order is walked
-- Returns one entry hash per entry.
local limit = tonumber(ARGV[3])
if limit == 0 then return {} end
local has_src, src = ARGV[4] == '1', ARGV[5]
local order = P .. 'ix:seen'
local tail = ''
if has_src then
  order = order .. ':' .. esc(src)
  tail = ':' .. esc(src)
end
local filters = {}
if ARGV[10] == '1' then table.insert(filters, P .. 'ix:status:' .. esc(ARGV[11]) .. tail) end
if ARGV[6] == '1' then table.insert(filters, P .. 'ix:stage:' .. esc(ARGV[7]) .. tail) end
if ARGV[8] == '1' then table.insert(filters, P .. 'ix:class:' .. esc(ARGV[9])) end

local function chunked(cmd, key, list)  -- cmd over list in slices (unpack has a stack limit)
  local out = {}
  for a = 1, #list, 500 do
    local b = math.min(a + 499, #list)
    local part = redis.call(cmd, key, unpack(list, a, b))
    for j = 1, #part do out[a + j - 1] = part[j] end
  end
  return out
end

local ids = {}
if #filters == 0 then
  ids = redis.call('ZREVRANGE', order, 0, limit < 0 and -1 or limit - 1)
else
  local smallest, size = nil, nil
  for _, k in ipairs(filters) do
    local n = redis.call('SCARD', k)
    if size == nil or n < size then smallest, size = k, n end
  end
  if size == 0 then return {} end
  if size <= tonumber(ARGV[12]) then
    -- few candidates: take the smallest set, keep what the others and the order zset hold
    local members = redis.call('SMEMBERS', smallest)
    local scores = chunked('ZMSCORE', order, members)
    local ok = {}
    for j = 1, #members do ok[j] = scores[j] ~= false end
    for _, k in ipairs(filters) do
      if k ~= smallest then
        local flags = chunked('SMISMEMBER', k, members)
        for j = 1, #members do if flags[j] == 0 then ok[j] = false end end
      end
    end
    local found = {}
    for j = 1, #members do
      if ok[j] then table.insert(found, {tonumber(scores[j]), members[j]}) end
    end
    table.sort(found, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      return x[2] > y[2]
    end)
    for j = 1, #found do
      if limit >= 0 and j > limit then break end
      ids[j] = found[j][2]
    end
  else
    -- many candidates everywhere: walk the order zset from the newest, keep the matches
    local step = math.min(1000, math.max(200, 2 * limit))
    local start, full = 0, false
    while not full do
      local chunk = redis.call('ZREVRANGE', order, start, start + step - 1)
      if #chunk == 0 then break end
      local ok = {}
      for j = 1, #chunk do ok[j] = true end
      for _, k in ipairs(filters) do
        local flags = redis.call('SMISMEMBER', k, unpack(chunk))
        for j = 1, #chunk do if flags[j] == 0 then ok[j] = false end end
      end
      for j = 1, #chunk do
        if ok[j] then
          table.insert(ids, chunk[j])
          if limit >= 0 and #ids >= limit then full = true break end
        end
      end
      start = start + step
    end
  end
end
local out = {}
for j = 1, #ids do out[j] = redis.call('HGETALL', P .. ids[j]) end
return out
