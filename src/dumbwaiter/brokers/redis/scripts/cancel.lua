--@include _lib
-- Cancel jobs that have not started (scheduled, retrying or ready).
-- ARGV: now, expires_at (cancelled jobs are pruned then), then the ids.
-- Returns the ids that were cancelled.
local now, expires = ARGV[1], ARGV[2]
local out = {}
for n = 3, #ARGV do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'q', 'a', 'ra', 'pr')
  if v[1] == 'ready' or v[1] == 'scheduled' then
    unlink(jk, id, v[2], v[1], v[3], v[4], v[5])
    redis.call('HSET', jk, 'st', 'cancelled', 'u', now, 'x', expires)
    redis.call('ZADD', P .. ':done', expires, id)
    count(v[2], 'cancelled', 1)
    out[#out + 1] = id
  end
end
flush_counts()
return out
