--@include _lib
--@include _events
-- Publish events (see _events.lua).  ARGV: now, then 6 per event: id, type,
-- run_at ('' = at once), priority, max_attempts, delivery body (the delivery's
-- JSON without id, queue and max_attempts).
-- An event whose id was published before (within the event retention) is
-- skipped, so a relay that publishes twice delivers once.  Each new event is
-- appended to its type's stream; an idle worker of every bound queue is
-- handed the queue's new events (below); busy workers read them with their
-- next fetch (see _events.lua).
-- Returns the number of deliveries: new events times their bound queues.
local now = ARGV[1]
local ms = string.format('%d', math.floor(tonumber(now) * 1000))
local seen = P .. ':evx'
local bound = {}
local woke = {}
local n = 0
for k = 2, #ARGV, 6 do
  local id, t = ARGV[k], ARGV[k + 1]
  if not redis.call('ZSCORE', seen, id) then
    redis.call('ZADD', seen, now, id)
    local fields = {'i', id, 't', now, 'm', ARGV[k + 4], 'b', ARGV[k + 5]}
    if ARGV[k + 2] ~= '' then
      fields[#fields + 1] = 'r'
      fields[#fields + 1] = ARGV[k + 2]
    end
    if ARGV[k + 3] ~= '0' then
      fields[#fields + 1] = 'p'
      fields[#fields + 1] = ARGV[k + 3]
    end
    local sk = evkey(t)
    local qs = bound[t]
    if not qs then
      qs = redis.call('HKEYS', P .. ':bind:' .. t)
      bound[t] = qs
      redis.call('SADD', P .. ':evtypes', t)
      if #qs > 0 and redis.call('EXISTS', sk) == 0 then
        -- the stream was deleted (by hand): its groups go with it, so bind again
        for _, q in ipairs(qs) do
          bind_group(t, q)
        end
      end
    end
    -- the id is the publish time, unless a producer with a clock ahead of
    -- ours wrote a later one: then its millisecond, with the next sequence
    local ok = redis.pcall('XADD', sk, ms .. '-*', unpack(fields))
    if type(ok) == 'table' and ok.err then
      local top = redis.call('XREVRANGE', sk, '+', '-', 'COUNT', 1)
      ok = #top > 0 and redis.pcall('XADD', sk,
        string.match(top[1][1], '^(%d+)-') .. '-*', unpack(fields))
      if not ok or (type(ok) == 'table' and ok.err) then
        redis.call('XADD', sk, '*', unpack(fields))
      end
    end
    n = n + #qs
    for _, q in ipairs(qs) do
      woke[q] = true
    end
  end
end
-- An idle worker of a bound queue gets the new events at once: read through
-- the queue's consumer group, leased to it and put in its inbox (as
-- enqueue.lua's offer does), so it starts them one hop after the publish.
-- A worker that waits on several of the bound queues (one worker, many
-- groups) gets each queue's events, up to its limit, in one inbox item.
local nnow = tonumber(now)
local handed = {} -- waiter -> {worker, lease end, room, token, batch}
local order = {}
for q in pairs(woke) do
  if redis.call('SISMEMBER', P .. ':paused', q) == 0 then
    local wk = P .. ':waiters:' .. q
    local wid, h = nil, nil
    for _, other in ipairs(order) do
      local o = handed[other]
      if o[3] > 0 then
        local score = redis.call('ZSCORE', wk, other)
        if score and tonumber(score) > nnow then
          redis.call('ZREM', wk, other)
          wid, h = other, o
          break
        end
      end
    end
    if not wid then
      local w
      wid, w = take_waiter(q, nnow)
      if wid then
        h = {w[1], nnow + tonumber(w[2]), tonumber(w[3]), nil, {}}
        handed[wid] = h
        order[#order + 1] = wid
      end
    end
    if wid then
      local fresh, full = read_new(q, h[3], now)
      if #fresh > 0 then
        if not h[4] then
          h[4] = redis.call('INCR', P .. ':fence')
        end
        for _, j in ipairs(fresh) do
          redis.call('HSET', jkey(j[1]), 'st', 'running', 'a', 1, 'tk', h[4], 'lu', h[2],
            'w', h[1], 'ib', wid)
          redis.call('ZADD', P .. ':running', h[2], j[1])
          h[5][#h[5] + 1] = {j[1], q, 1, j[2], '', h[4], h[2]}
        end
        h[3] = h[3] - #fresh
        count(q, 'running', #fresh)
      end
      if full then
        wake(q, now)
      end
    end
  end
end
for _, wid in ipairs(order) do
  local h = handed[wid]
  redis.call('RPUSH', P .. ':in:' .. wid, #h[5] > 0 and cjson.encode(h[5]) or 'w')
end
flush_counts()
return n
