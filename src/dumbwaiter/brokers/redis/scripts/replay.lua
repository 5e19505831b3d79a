--@include _lib
--@include _filter
-- Make matching dead jobs ready again with fresh attempts, keeping their
-- error history and counting the replay (see _filter.lua for ARGV).
-- Returns {cursor, count}: call again with the cursor until it is ''.
local now = ARGV[1]
local woke = {}
local n = 0
local cursor = walk(function(id, v)
  if v[3] ~= 'dead' then
    return
  end
  local jk = jkey(id)
  redis.call('ZREM', P .. ':dead', id)
  redis.call('HSET', jk, 'a', 0, 'u', now)
  redis.call('HINCRBY', jk, 'rp', 1)
  redis.call('HDEL', jk, 'x')
  make_ready(jk, id, v[1], v[8], now)
  count(v[1], 'dead', -1)
  woke[v[1]] = true
  n = n + 1
end)
for q in pairs(woke) do
  wake(q, now)
end
flush_counts()
return {cursor, n}
