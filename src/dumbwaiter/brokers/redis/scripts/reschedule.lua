--@include _lib
-- Move jobs that have not started (scheduled, retrying, ready) to run at a
-- time (debounce pushes a burst's job back).  ARGV: now, at, then the ids.
-- Returns the ids that moved.
local now, at = ARGV[1], ARGV[2]
local later = tonumber(at) > tonumber(now)
local out = {}
local woke = {}
for n = 3, #ARGV do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'q', 'a', 'ra', 'pr')
  if v[1] == 'ready' or v[1] == 'scheduled' then
    local q = v[2]
    unlink(jk, id, q, v[1], v[3], v[4], v[5])
    redis.call('HSET', jk, 'u', now)
    if later then
      redis.call('HSET', jk, 'st', 'scheduled', 'ra', at)
      redis.call('ZADD', P .. ':sched:' .. q, at, id)
      if tonumber(v[3] or '0') > 0 then
        count(q, 'retrying', 1)
      end
    else
      make_ready(jk, id, q, v[5], now)
      woke[q] = true
    end
    out[#out + 1] = id
  end
end
for q in pairs(woke) do
  wake(q, now)
end
flush_counts()
return out
