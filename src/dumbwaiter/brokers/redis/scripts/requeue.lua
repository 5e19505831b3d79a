--@include _lib
-- Give leased jobs back without charging the attempt: a worker stopping, or
-- a job held back by a rate or concurrency limit.  ARGV: now, then 3 per
-- job: id, token, ready_at (due now or earlier: ready at once).
local now = ARGV[1]
local running = P .. ':running'
local woke = {}
local nnow = tonumber(now)
for n = 2, #ARGV, 3 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q', 'pr', 'a')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    local a = tonumber(v[5] or '0')
    a = a > 0 and a - 1 or 0
    redis.call('HSET', jk, 'a', a, 'u', now)
    redis.call('HDEL', jk, 'tk', 'lu')
    redis.call('ZREM', running, id)
    count(v[3], 'running', -1)
    local at = ARGV[n + 2]
    if tonumber(at) > nnow then
      redis.call('HSET', jk, 'st', 'scheduled', 'ra', at)
      redis.call('ZADD', P .. ':sched:' .. v[3], at, id)
      if a > 0 then
        count(v[3], 'retrying', 1)
      end
    else
      make_ready(jk, id, v[3], v[4], now)
      woke[v[3]] = true
    end
  end
end
for q in pairs(woke) do
  wake(q, now)
end
flush_counts()
return 0
