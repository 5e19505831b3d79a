-- Filtered walks over the job indexes, shared by list, replay and purge.
--
-- ARGV: [1] now, [2] cursor ('' = from the newest), [3] limit (matches
-- wanted), [4] budget (jobs looked at, at most, so one call never holds the
-- server for long), [5] queue, [6] name, [7] state, [8] error type, [9]
-- since, [10] until, [11] key ('' = no such filter), [12] index: 'ids'
-- (every job), 'dead' (dead letters) or 'given' (the ids from ARGV[13] on,
-- newest first).
-- Both indexes are sorted sets of ids with one score, so they sort by id:
-- UUIDv7 ids sort by creation time, and a page is one range read from the
-- cursor down.
local F_queue, F_name, F_state, F_etype = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local F_since, F_until = tonumber(ARGV[9]), tonumber(ARGV[10])
local F_key = ARGV[11]
-- The key's JSON text when it has one spelling (printable ASCII without
-- '"', '\' or '/': every JSON encoder writes such a string as it is, while
-- any other may be escaped in several ways): bodies without it are skipped
-- unparsed.  nil: every body is parsed.
local F_needle = nil
if F_key ~= '' and not string.find(F_key, '[%c"\\/\128-\255]') then
  F_needle = '"' .. F_key .. '"'
end

-- Whether the job's message key is F_key.  The 'k' field holds a task's key
-- while the job holds it (a newer unique job frees it; events never hold
-- one), so a job without it is judged by its body's top-level "key".
local function key_matches(k, body)
  if k then
    return k == F_key
  end
  if not body or (F_needle and not string.find(body, F_needle, 1, true)) then
    return false
  end
  local ok, m = pcall(cjson.decode, body)
  return ok and type(m) == 'table' and m.key == F_key
end

local function state_of(st, a)
  if st == 'scheduled' and tonumber(a or '0') > 0 then
    return 'retrying'
  end
  return st
end

-- The fields of a job a filter looks at; nil if it is not stored, or staged
-- (not enqueued yet: see _lib.lua, unstage).
local function matches(id)
  local v
  if F_key == '' then
    v = redis.call('HMGET', jkey(id), 'q', 'n', 'st', 'a', 'u', 'et', 'ra', 'pr', 'k')
  else -- the body in the same read, for key_matches
    v = redis.call('HMGET', jkey(id), 'q', 'n', 'st', 'a', 'u', 'et', 'ra', 'pr', 'k', 'body')
  end
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
  if F_key ~= '' and not key_matches(v[9], v[10]) then return nil end
  return v
end

-- Call fn(id, fields) for matching jobs, newest first, until it has been
-- called `limit` times or `budget` jobs were looked at.  Returns the cursor to
-- go on from ('' when the index is exhausted) and how many matched.
local function walk(fn)
  local cursor, limit, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  local index = ARGV[12]
  local found, looked = 0, 0
  local given_at = 13
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
