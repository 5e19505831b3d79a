--@include _lib
-- Move leased jobs to the dead-letter queue, keeping every attempt's error.
-- ARGV: now, then 4 per job: id, token, error (JSON record, '' = none),
-- error type.  Dead letters stay until purged or replayed.
local now = ARGV[1]
local running, dead = P .. ':running', P .. ':dead'
for n = 2, #ARGV, 4 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    append_error(jk, ARGV[n + 2], ARGV[n + 3])
    redis.call('HDEL', jk, 'tk', 'lu')
    redis.call('HSET', jk, 'st', 'dead', 'u', now)
    redis.call('ZREM', running, id)
    redis.call('ZADD', dead, 0, id)
    count(v[3], 'running', -1)
    count(v[3], 'dead', 1)
  end
end
flush_counts()
return 0
