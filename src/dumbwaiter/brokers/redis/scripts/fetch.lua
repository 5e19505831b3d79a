--@include _lib
--@include _events
-- Lease up to `limit` ready jobs.  ARGV: now, limit, lease (seconds), worker,
-- waiter ('' = none), register_until ('' = do not wait), then the queues in
-- the order to take them.
-- 1. A waiter's inbox is emptied first and the waiter withdrawn: jobs handed
--    to it meanwhile are its own (already leased) and are returned as they
--    are (raw inbox items, see enqueue.lua).
-- 2. Due scheduled jobs of the queues become ready.
-- 3. Up to `limit` ready jobs are claimed: attempt + 1, state running, the
--    lease and this call's fencing token (every later change of the job
--    must present it).  A popped member whose job is not `ready` (deleted,
--    or a stale second member) is dropped: a job is never leased twice.
-- 4. A subscriber group's queue then reads its new events (see _events.lua):
--    as many as are still wanted, from each bound stream, become jobs,
--    claimed the same way.  If more are ready or unread, another idle worker
--    is woken.
-- 5. With nothing at all and `register_until` given, the waiter registers in
--    every queue it takes that is not paused, so that enqueue can hand it
--    jobs and others can wake it.
-- Returns {token, next_due, number of inbox items, the items, then id,
-- queue, attempt, body, errors per claimed job}; next_due ('' = none) is the
-- earliest scheduled job of the queues when nothing was claimed, so a waiting
-- worker knows how long it may sleep.
local now, limit, lease, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local wid, register = ARGV[5], ARGV[6]
local nnow = tonumber(now)
local lease_until = nnow + tonumber(lease)
local first_q = 7
local items = {}
if wid ~= '' then
  local ik = P .. ':in:' .. wid
  items = redis.call('LRANGE', ik, 0, -1)
  if #items > 0 then
    redis.call('DEL', ik)
  end
  redis.call('DEL', P .. ':w:' .. wid)
  for n = first_q, #ARGV do
    redis.call('ZREM', P .. ':waiters:' .. ARGV[n], wid)
  end
end
local jobs = {}
local got = 0
local token = 0
for n = first_q, #ARGV do
  local q = ARGV[n]
  local sk = P .. ':sched:' .. q
  local rk = P .. ':ready:' .. q
  local due = redis.call('ZRANGEBYSCORE', sk, '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(due) do
    local jk = jkey(id)
    local v = redis.call('HMGET', jk, 'pr', 'ra', 'a')
    if v[1] then
      make_ready(jk, id, q, v[1], v[2])
      if tonumber(v[3] or '0') > 0 then
        count(q, 'retrying', -1)
      end
    end
  end
  if #due > 0 then
    redis.call('ZREM', sk, unpack(due))
  end
  local open = redis.call('SISMEMBER', P .. ':paused', q) == 0
  if got < limit and open then
    local popped = redis.call('ZPOPMIN', rk, limit - got)
    if #popped > 0 then
      if token == 0 then
        token = redis.call('INCR', P .. ':fence')
      end
      local running = P .. ':running'
      local claimed = 0
      for j = 1, #popped, 2 do
        local id = string.sub(popped[j], 17)
        local jk = jkey(id)
        if redis.call('HGET', jk, 'st') == 'ready' then
          local a = redis.call('HINCRBY', jk, 'a', 1)
          redis.call('HSET', jk, 'st', 'running', 'tk', token, 'lu', lease_until, 'w', worker,
            'u', now)
          redis.call('ZADD', running, lease_until, id)
          local v = redis.call('HMGET', jk, 'body', 'err')
          jobs[#jobs + 1] = id
          jobs[#jobs + 1] = q
          jobs[#jobs + 1] = a
          jobs[#jobs + 1] = v[1]
          jobs[#jobs + 1] = v[2] or ''
          claimed = claimed + 1
        end
      end
      got = got + claimed
      count(q, 'running', claimed)
    end
  end
  -- a subscriber group's queue: its new events become jobs, claimed at once
  local more_unread = false
  if got < limit and open then
    local fresh
    fresh, more_unread = read_new(q, limit - got, now)
    if #fresh > 0 then
      if token == 0 then
        token = redis.call('INCR', P .. ':fence')
      end
      local running = P .. ':running'
      for _, j in ipairs(fresh) do
        redis.call('HSET', jkey(j[1]), 'st', 'running', 'a', 1, 'tk', token, 'lu', lease_until,
          'w', worker)
        redis.call('ZADD', running, lease_until, j[1])
        jobs[#jobs + 1] = j[1]
        jobs[#jobs + 1] = q
        jobs[#jobs + 1] = 1
        jobs[#jobs + 1] = j[2]
        jobs[#jobs + 1] = ''
      end
      got = got + #fresh
      count(q, 'running', #fresh)
    end
  end
  -- more ready than we took: pass the wake-up on to another idle worker
  if open and got >= limit and (more_unread or redis.call('EXISTS', rk) == 1) then
    wake(q, now)
  end
end
local next_due = ''
if got == 0 and #items == 0 then
  local best = nil
  for n = first_q, #ARGV do
    local q = ARGV[n]
    if redis.call('SISMEMBER', P .. ':paused', q) == 0 then
      local first = redis.call('ZRANGE', P .. ':sched:' .. q, 0, 0, 'WITHSCORES')
      if #first > 0 and (best == nil or tonumber(first[2]) < best) then
        best = tonumber(first[2])
        next_due = first[2]
      end
      if register ~= '' then
        local wk = P .. ':waiters:' .. q
        redis.call('ZREMRANGEBYSCORE', wk, '-inf', now)
        redis.call('ZADD', wk, register, wid)
      end
    end
  end
  if register ~= '' then
    local wh = P .. ':w:' .. wid
    redis.call('HSET', wh, 'worker', worker, 'lease', lease, 'limit', limit)
    -- garbage collection only: a dead waiter's entry expires with its score
    redis.call('EXPIRE', wh, math.ceil(tonumber(register) - nnow) + 60)
  end
end
flush_counts()
local out = {token, next_due, #items}
for _, item in ipairs(items) do
  out[#out + 1] = item
end
for _, v in ipairs(jobs) do
  out[#out + 1] = v
end
return out
