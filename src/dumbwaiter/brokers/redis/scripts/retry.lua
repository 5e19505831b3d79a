--@include _lib
-- Record a failed attempt and make the job ready again at a time.
-- ARGV: now, then 5 per job: id, token, retry_at, error (JSON record, '' =
-- none), error type.  Due now: ready at once (and idle workers woken); later:
-- `retrying` in the queue's scheduled set.
local now = ARGV[1]
local nnow = tonumber(now)
local running = P .. ':running'
local woke = {}
for n = 2, #ARGV, 5 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q', 'pr')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    local q, at = v[3], ARGV[n + 2]
    append_error(jk, ARGV[n + 3], ARGV[n + 4])
    redis.call('HDEL', jk, 'tk', 'lu')
    redis.call('HSET', jk, 'u', now)
    redis.call('ZREM', running, id)
    count(q, 'running', -1)
    if tonumber(at) > nnow then
      local sk = P .. ':sched:' .. q
      local first = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
      if #first == 0 or tonumber(first[2]) > tonumber(at) then
        woke[q] = true -- due before the time idle workers sleep until
      end
      redis.call('HSET', jk, 'st', 'scheduled', 'ra', at)
      redis.call('ZADD', sk, at, id)
      count(q, 'retrying', 1)
    else
      make_ready(jk, id, q, v[4], now)
      woke[q] = true
    end
  end
end
for q in pairs(woke) do
  wake(q, now)
end
flush_counts()
return 0
