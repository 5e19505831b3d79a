--@include _lib
-- Lease up to `limit` ready jobs.  ARGV: now, limit, lease_until, worker,
-- then the queues in the order to take them.
-- First the due scheduled jobs of those queues become ready.  Each claimed
-- job gets attempt + 1, state running, the lease and this call's fencing
-- token (every later change of the job must present it).
-- Returns {token, next_due, then id, queue, attempt, body, errors per job};
-- next_due ('' = none) is the earliest scheduled job of the queues when
-- nothing was claimed, so an idle worker knows how long it may sleep.
local now, limit, lease_until, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local out = {0, ''}
local got = 0
local token = nil
for n = 5, #ARGV do
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
  if got < limit and redis.call('SISMEMBER', P .. ':paused', q) == 0 then
    local popped = redis.call('ZPOPMIN', rk, limit - got)
    if #popped > 0 then
      if not token then
        token = redis.call('INCR', P .. ':fence')
        out[1] = token
      end
      local running = P .. ':running'
      local claimed = 0
      for j = 1, #popped, 2 do
        local id = string.sub(popped[j], 17)
        local jk = jkey(id)
        if redis.call('EXISTS', jk) == 1 then
          local a = redis.call('HINCRBY', jk, 'a', 1)
          redis.call('HSET', jk, 'st', 'running', 'tk', token, 'lu', lease_until, 'w', worker,
            'u', now)
          redis.call('ZADD', running, lease_until, id)
          local v = redis.call('HMGET', jk, 'body', 'err')
          out[#out + 1] = id
          out[#out + 1] = q
          out[#out + 1] = a
          out[#out + 1] = v[1]
          out[#out + 1] = v[2] or ''
          claimed = claimed + 1
        end
      end
      got = got + claimed
      count(q, 'running', claimed)
      -- more ready than we took: pass the wake-up on to the next idle worker
      if redis.call('EXISTS', rk) == 1 then
        wake(q)
      end
    end
  end
end
if got == 0 then
  local next_due = nil
  for n = 5, #ARGV do
    local q = ARGV[n]
    if redis.call('SISMEMBER', P .. ':paused', q) == 0 then
      local first = redis.call('ZRANGE', P .. ':sched:' .. q, 0, 0, 'WITHSCORES')
      if #first > 0 and (next_due == nil or tonumber(first[2]) < tonumber(next_due)) then
        next_due = first[2]
      end
    end
  end
  out[2] = next_due or ''
end
flush_counts()
return out
