--@include _core
-- One page of compact records (see ack.lua), newest id first.  They are in
-- no id index, only in `fin` (finishing order): this reads the newest
-- `budget` entries of it, keeps those matching the filter with an id below
-- the cursor, and returns the first `limit` + 1 by id, so the caller can
-- merge them with a page of the id index (admin.py).
-- ARGV: [1] cursor ('' = from the newest), [2] limit, [3] budget, [4] queue,
-- [5] name, [6] since, [7] until ('' = no such filter).
-- Returns 14 fields per record, as list.lua does (the missing ones '').
local cursor, limit, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local F_queue, F_name = ARGV[4], ARGV[5]
local F_since, F_until = tonumber(ARGV[6]), tonumber(ARGV[7])
local fin = P .. ':fin'
local found = {}
local looked = 0
local stop = -1
while looked < budget do
  local n = math.min(500, budget - looked)
  local ids = redis.call('LRANGE', fin, stop - n + 1, stop)
  if #ids == 0 then
    break
  end
  for j = #ids, 1, -1 do
    local id = ids[j]
    if cursor == '' or id < cursor then
      local v = redis.call('HMGET', jkey(id), 'st', 'q', 'n', 's', 'u', 'body', 'a', 'rp')
      local u = tonumber(v[5] or '0')
      if v[1] == 'succeeded' and not v[6]
        and (F_queue == '' or v[2] == F_queue) and (F_name == '' or v[3] == F_name)
        and not (F_since and u < F_since) and not (F_until and u > F_until) then
        found[#found + 1] = {id, '', v[2], v[1], v[7] or '', '', '', v[5], '', '', '', v[8] or '',
          v[3], v[4] or ''}
      end
    end
  end
  looked = looked + #ids
  if #ids < n then
    break
  end
  stop = stop - n
end
table.sort(found, function(a, b) return a[1] > b[1] end)
local out = {}
for k = 1, math.min(#found, limit + 1) do
  local f = found[k]
  for j = 1, 14 do
    out[#out + 1] = f[j]
  end
end
return out
