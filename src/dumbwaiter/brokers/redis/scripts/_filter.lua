-- Filtered walks over the job indexes, shared by list, replay and purge.
--
-- ARGV: [1] now, [2] cursor ('' = from the newest), [3] limit (matches
-- wanted), [4] budget (jobs looked at, at most, so one call never holds the
-- server for long), [5] queue, [6] name, [7] state, [8] error type, [9]
-- since, [10] until ('' = no such filter), [11] index: 'ids' (every job),
-- 'dead' (dead letters) or 'given' (the ids from ARGV[12] on, newest first).
-- Both indexes are sorted sets of ids with one score, so they sort by id:
-- UUIDv7 ids sort by creation time, and a page is one range read from the
-- cursor down.
local F_queue, F_name, F_state, F_etype = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local F_since, F_until = tonumber(ARGV[9]), tonumber(ARGV[10])

local function state_of(st, a)
  if st == 'scheduled' and tonumber(a or '0') > 0 then
    return 'retrying'
  end
  return st
end

-- The fields of a job a filter looks at; nil if it is not stored, or staged
-- (not enqueued yet: see _lib.lua, unstage).
local function matches(id)
  local v = redis.call('HMGET', jkey(id), 'q', 'n', 'st', 'a', 'u', 'et', 'ra', 'pr', 'k')
  if not v[3] or v[3] == 'staged' then
    return nil
  end
  if F_queue ~= '' and v[1] ~= F_queue then return nil end
  if F_name ~= '' and v[2] ~= F_name then return nil end
  if F_state ~= '' and state_of(v[3], v[4]) ~= F_state then return nil end
  local u = tonumber(v[5] or '0')
  if F_since and u < F_since then return nil end
  if F_until and u > F_until then return nil end
  if F_etype ~= '' then
    local et = v[6]
    if not et then return nil end
    if et ~= F_etype and string.match(et, '([^.]*)$') ~= F_etype then return nil end
  end
  return v
end

-- Call fn(id, fields) for matching jobs, newest first, until it has been
-- called `limit` times or `budget` jobs were looked at.  Returns the cursor to
-- go on from ('' when the index is exhausted) and how many matched.
local function walk(fn)
  local cursor, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  local index = ARGV[11]
  local found, looked = 0, 0
  local given_at = 12
  while true do
    local ids
    if index == 'given' then
      ids = {}
      for n = given_at, math.min(#ARGV, given_at + 499) do
        ids[#ids + 1] = ARGV[n]
      end
      given_at = given_at + 500
    else
      local key = P .. ':' .. index
      local top = cursor == '' and '+' or '(' .. cursor
      ids = redis.call('ZREVRANGEBYLEX', key, top, '-', 'LIMIT', 0, 500)
    end
    if #ids == 0 then
      return '', found
    end
    for _, id in ipairs(ids) do
      if found >= limit or looked >= budget then
        return cursor, found
      end
      looked = looked + 1
      cursor = id
      local v = matches(id)
      if v then
        found = found + 1
        fn(id, v)
      end
    end
  end
end
