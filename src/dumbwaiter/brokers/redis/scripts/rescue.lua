--@include _lib
--@include _events
-- Housekeeping, run by every worker about once a second:
-- 1. jobs whose lease ran out go back to ready with a LeaseExpired error
--    (dead when that was their last attempt);
-- 2. finished jobs past their retention, expired kv entries, and jobs staged
--    by a bulk enqueue whose producer died before committing, are deleted.
-- 3. events published before the event retention are trimmed from their
--    streams (XTRIM MINID), but never one a live consumer group has not
--    read yet (see alive below), and their ids leave the set publish
--    de-duplicates with.
-- ARGV: now, limit (per kind and call), event cutoff (now - retention; ''
-- = keep events), retention (seconds compact records are kept).  Returns {leases rescued, 1 if there
-- is more to do than one call does, {id, queue, name, error record JSON,
-- attempt, body, errors JSON} of each job it dead-lettered (flat)}.
-- With nothing to do it costs three range reads on small sets.
local now, limit = ARGV[1], tonumber(ARGV[2])
local etype = 'dumbwaiter.errors.LeaseExpired'
local running = P .. ':running'
local expired = redis.call('ZRANGEBYSCORE', running, '-inf', now, 'LIMIT', 0, limit)
local woke = {}
local rescued = 0
local buried = {}
local inboxes = {}
for _, id in ipairs(expired) do
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'a', 'ma', 'w', 'q', 'pr', 'ib')
  redis.call('ZREM', running, id)
  if v[1] == 'running' then
    rescued = rescued + 1
    local a, w, q = v[2] or '0', v[4] or '', v[5]
    redis.call('HDEL', jk, 'tk', 'lu', 'ib')
    redis.call('HSET', jk, 'u', now)
    count(q, 'running', -1)
    -- handed to a waiter that never took it from its inbox (it died while
    -- idle): the job did not run, so the attempt is not charged
    local untouched = false
    if v[7] then
      local items = inboxes[v[7]]
      if not items then
        items = redis.call('LRANGE', P .. ':in:' .. v[7], 0, -1)
        inboxes[v[7]] = items
      end
      for _, item in ipairs(items) do
        if string.find(item, '"' .. id .. '"', 1, true) then
          untouched = true
        end
      end
    end
    if untouched then
      redis.call('HSET', jk, 'a', math.max(tonumber(a) - 1, 0))
      make_ready(jk, id, q, v[6], now)
      woke[q] = true
    else
      local rec = '{"time":' .. now .. ',"type":"' .. etype .. '","message":'
        .. cjson.encode('lease expired: worker ' .. (w ~= '' and w or '?')
          .. ' stopped heartbeating during attempt ' .. a)
        .. ',"traceback":"","worker":' .. cjson.encode(w) .. ',"attempt":' .. a .. '}'
      append_error(jk, rec, etype)
      if tonumber(a) >= tonumber(v[3] or '1') then
        redis.call('HSET', jk, 'st', 'dead')
        redis.call('ZADD', P .. ':dead', 0, id)
        count(q, 'dead', 1)
        -- the report carries the envelope (on_dead hooks log its arguments):
        -- the body and every error, read only for the rare buried job
        local d = redis.call('HMGET', jk, 'n', 'body', 'err')
        buried[#buried + 1] = id
        buried[#buried + 1] = q or ''
        buried[#buried + 1] = d[1] or ''
        buried[#buried + 1] = rec
        buried[#buried + 1] = a
        buried[#buried + 1] = d[2] or ''
        buried[#buried + 1] = d[3] or ''
      else
        make_ready(jk, id, q, v[6], now)
        woke[q] = true
      end
    end
  end
end
for wid, items in pairs(inboxes) do
  if #items > 0 then
    redis.call('DEL', P .. ':in:' .. wid)
  end
end
for q in pairs(woke) do
  wake(q, now)
end
-- finished jobs past their retention
local done = P .. ':done'
local old = redis.call('ZRANGEBYSCORE', done, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(old) do
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'q', 'k')
  if v[1] == 'succeeded' or v[1] == 'cancelled' then
    count(v[2], v[1], -1)
    forget(jk, id, v[3])
  end
end
if #old > 0 then
  redis.call('ZREM', done, unpack(old))
end
-- compact records (see ack.lua) past the retention, oldest finished first:
-- the head of `fin` until one is not due.  An entry whose record is not a
-- compact one any more (purged, and its id enqueued again) is only dropped.
local fin = P .. ':fin'
local due = tonumber(now) - tonumber(ARGV[4])
local pruned = 0
while pruned < limit do
  local id = redis.call('LINDEX', fin, 0)
  if not id then
    break
  end
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'q', 'u', 'body')
  if v[1] == 'succeeded' and not v[4] then
    if tonumber(v[3]) > due then
      break
    end
    count(v[2], 'succeeded', -1)
    redis.call('DEL', jk)
  end
  redis.call('LPOP', fin)
  pruned = pruned + 1
end
-- expired key-value entries
local kvx = P .. ':kvx'
local gone = redis.call('ZRANGEBYSCORE', kvx, '-inf', now, 'LIMIT', 0, limit)
if #gone > 0 then
  redis.call('HDEL', P .. ':kv', unpack(gone))
  redis.call('ZREM', P .. ':kvn', unpack(gone))
  redis.call('ZREM', kvx, unpack(gone))
end
-- bulk enqueues whose producer died between staging and commit
for _, call in ipairs(redis.call('ZRANGEBYSCORE', P .. ':staging', '-inf', now, 'LIMIT', 0, 10)) do
  unstage(call)
end
-- Whether consumer group q of stream k still holds back the trimming of
-- the entries it has not read: while its queue is paused (someone stopped it
-- on purpose), or while its workers read it (its consumer, `dw`, read within
-- the retention: every fetch and hand-over of the queue reads).  A group
-- whose subscriber was removed from the code, or whose workers have been
-- gone for longer than the retention, no longer does: the log is then
-- trimmed to the retention past its place, as for everyone (else one
-- forgotten group would keep every event of its type for ever).
local function alive(k, q, retention_ms)
  if redis.call('SISMEMBER', P .. ':paused', q) == 1 then
    return true
  end
  local cs = redis.pcall('XINFO', 'CONSUMERS', k, q)
  if type(cs) == 'table' and not cs.err then
    for _, c in ipairs(cs) do
      local cf = entry_fields(c)
      if tonumber(cf['idle']) < retention_ms then
        return true
      end
    end
  end
  return false
end

-- the event log past its retention
local old_events = 0
local cutoff = ARGV[3]
if cutoff and cutoff ~= '' then
  local retention_ms = (tonumber(now) - tonumber(cutoff)) * 1000
  local seen = redis.call('ZRANGEBYSCORE', P .. ':evx', '-inf', cutoff, 'LIMIT', 0, limit)
  if #seen > 0 then
    redis.call('ZREM', P .. ':evx', unpack(seen))
  end
  old_events = #seen
  local min_id = string.format('%d', math.floor(tonumber(cutoff) * 1000)) .. '-0'
  for _, t in ipairs(redis.call('SMEMBERS', P .. ':evtypes')) do
    local k = evkey(t)
    local first = redis.call('XRANGE', k, '-', '+', 'COUNT', 1)
    if #first > 0 and sid_lt(first[1][1], min_id) then
      local keep = min_id
      local groups = redis.pcall('XINFO', 'GROUPS', k)
      if type(groups) == 'table' and not groups.err then
        for _, g in ipairs(groups) do
          local gf = entry_fields(g)
          local ld = gf['last-delivered-id']
          -- entries after ld are unread by that group: keep them (and ld)
          -- while the group is alive
          if sid_lt(ld, keep) and alive(k, gf['name'], retention_ms) then
            keep = ld
          end
        end
      end
      -- at most `limit` entries per stream and call
      local span = redis.call('XRANGE', k, '-', keep, 'COUNT', limit + 1)
      if #span > limit then
        keep = span[limit + 1][1]
        old_events = limit
      end
      redis.call('XTRIM', k, 'MINID', keep)
    end
  end
end
flush_counts()
-- more than one call's worth: the caller calls again
local more = (#expired >= limit or #old >= limit or pruned >= limit or old_events >= limit)
  and 1 or 0
return {rescued, more, buried}
