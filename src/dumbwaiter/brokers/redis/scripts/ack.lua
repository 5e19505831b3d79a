--@include _core
--@include _counts
-- Mark leased jobs succeeded.  ARGV: now, then 4 per job: id, token,
-- expires_at (pruned then), result ('' = none kept).
-- A job whose lease this token no longer holds is left alone (it was rescued
-- and maybe fetched again), so acking twice or late changes nothing.
local now = ARGV[1]
local running, done = P .. ':running', P .. ':done'
for n = 2, #ARGV, 4 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    redis.call('HSET', jk, 'st', 'succeeded', 'u', now, 'x', ARGV[n + 2])
    redis.call('HDEL', jk, 'tk', 'lu')
    if ARGV[n + 3] ~= '' then
      redis.call('HSET', jk, 'res', ARGV[n + 3])
    end
    redis.call('ZREM', running, id)
    redis.call('ZADD', done, ARGV[n + 2], id)
    count(v[3], 'running', -1)
    count(v[3], 'succeeded', 1)
  end
end
flush_counts()
return 0
