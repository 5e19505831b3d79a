-- Events (include after _lib): the log and the fan-out to subscriber groups.
--
-- Each event type is a stream, `ev:<type>`: publish.lua XADDs one entry per
-- event (fields: i = event id, t = publish time, m = the event's
-- max_attempts, b = the delivery body without id, queue and max_attempts;
-- r = run at, p = priority when set).  Entry ids are the publish time in
-- milliseconds (`<ms>-<seq>`, never below the stream's last id), so the log
-- is time-ordered and list_events reads it with XRANGE.
--
-- Each subscriber group's queue is a consumer group of every stream bound
-- to it, named after the queue (`bind:<type>` maps queue -> max_attempts,
-- `gs:<queue>` lists the types bound to the queue).  A fetch of that queue
-- reads new entries with XREADGROUP ... NOACK and turns each into a job of
-- the queue in the same script, so from then on the delivery is an ordinary
-- job: leased with a fencing token, heartbeated, retried at a time, dead-
-- lettered with its errors, listed and replayed.  The consumer group is the
-- group's cursor in the log; its pending-entries list stays empty because
-- nothing is between "read" and "a job" (see docs/redis.md, Events).

local function evkey(t)
  return P .. ':ev:' .. t
end

-- {ms, seq} of a stream id
local function sid(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local function sid_lt(a, b)
  local am, as = sid(a)
  local bm, bs = sid(b)
  return am < bm or (am == bm and as < bs)
end

-- The delivery job's id: UUIDv7-shaped, with the event id's time (so
-- deliveries list in publish order) and the rest from a hash of the event id
-- and the queue, so one event makes one job per queue however often it is read.
local function delivery_id(eid, q)
  local h = redis.sha1hex(eid .. '\n' .. q)
  local e = string.gsub(eid, '-', '')
  local ts = string.sub(h, 1, 12)
  if #e == 32 and string.match(e, '^%x+$') then
    ts = string.sub(e, 1, 12)
  end
  local v = tonumber(string.sub(h, 13, 13), 16) % 4 + 1
  local variant = string.sub('89ab', v, v)
  return string.sub(ts, 1, 8) .. '-' .. string.sub(ts, 9, 12) .. '-7' .. string.sub(h, 14, 16)
    .. '-' .. variant .. string.sub(h, 17, 19) .. '-' .. string.sub(h, 20, 31)
end

local function entry_fields(flat)
  local f = {}
  for j = 1, #flat, 2 do
    f[flat[j]] = flat[j + 1]
  end
  return f
end

-- Create the consumer group of queue q on the stream of type t at the
-- stream's end (events published before the binding are in the log only).
local function bind_group(t, q)
  local r = redis.pcall('XGROUP', 'CREATE', evkey(t), q, '$', 'MKSTREAM')
  if type(r) == 'table' and r.err and not string.find(r.err, 'BUSYGROUP', 1, true) then
    return redis.error_reply(r.err)
  end
end

-- Read up to `want` unread entries of the streams bound to q and store each
-- as a job of q (its fields but no state set, so the caller claims it or
-- makes it ready).  Deliveries with a run time in the future are scheduled
-- instead.  Returns the due jobs {id, body, priority, run_at} and whether a
-- stream had `want` or more unread (there may be more).
local function read_new(q, want, now)
  local types = redis.call('SMEMBERS', P .. ':gs:' .. q)
  local full = false
  local due = {}
  local nnow = tonumber(now)
  local left = want
  for _, t in ipairs(types) do
    if left <= 0 then
      full = true -- streams not looked at may have unread entries
      break
    end
    local r = redis.pcall('XREADGROUP', 'GROUP', q, 'dw', 'COUNT', left, 'NOACK', 'STREAMS',
      evkey(t), '>')
    if type(r) == 'table' and r.err then
      -- the stream or its group was deleted behind our back: bind again
      bind_group(t, q)
      r = nil
    end
    local entries = (r and r[1]) and r[1][2] or {}
    if #entries >= left then
      full = true
    end
    left = left - #entries
    if #entries > 0 then
      local ma = redis.call('HGET', P .. ':bind:' .. t, q)
      local ids = {}
      local qjson = cjson.encode(q)
      for _, e in ipairs(entries) do
        local f = entry_fields(e[2])
        local id = delivery_id(f.i, q)
        local jk = jkey(id)
        if redis.call('EXISTS', jk) == 0 then
          local attempts = ma or f.m
          local body = '{"id":"' .. id .. '","queue":' .. qjson .. ',"max_attempts":' .. attempts
            .. ',' .. string.sub(f.b, 2)
          local pr = f.p or '0'
          local ra = f.t
          if f.r and tonumber(f.r) > tonumber(f.t) then
            ra = f.r
          end
          redis.call('HSET', jk, 'body', body, 'q', q, 'n', t, 'pr', pr, 'ma', attempts, 'u', now,
            'ra', ra)
          ids[#ids + 1] = 0
          ids[#ids + 1] = id
          if tonumber(ra) > nnow then
            redis.call('HSET', jk, 'st', 'scheduled')
            redis.call('ZADD', P .. ':sched:' .. q, ra, id)
          else
            due[#due + 1] = {id, body, pr, ra}
          end
        end
      end
      if #ids > 0 then
        redis.call('ZADD', P .. ':ids', unpack(ids))
      end
    end
  end
  return due, full
end

-- Unread entries of queue q's consumer groups: {count, oldest publish time
-- (a number of seconds, or nil)}.
local function unread(q)
  local n, oldest = 0, nil
  for _, t in ipairs(redis.call('SMEMBERS', P .. ':gs:' .. q)) do
    local k = evkey(t)
    local groups = redis.pcall('XINFO', 'GROUPS', k)
    if type(groups) == 'table' and not groups.err then
      for _, g in ipairs(groups) do
        local gf = entry_fields(g)
        if gf['name'] == q then
          local ld = gf['last-delivered-id']
          local after = redis.call('XRANGE', k, '(' .. ld, '+', 'COUNT', 1)
          if #after > 0 then
            local lag = gf['lag']
            if not lag then
              lag = #redis.call('XRANGE', k, '(' .. ld, '+', 'COUNT', 10000)
            end
            n = n + lag
            local tt = tonumber(entry_fields(after[1][2]).t)
            if oldest == nil or tt < oldest then
              oldest = tt
            end
          end
        end
      end
    end
  end
  return n, oldest
end
