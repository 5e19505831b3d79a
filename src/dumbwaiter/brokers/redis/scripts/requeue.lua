--@include _lib
-- Give leased jobs back without charging the attempt (a worker stopping).
-- ARGV: now, then 2 per job: id, token.
local now = ARGV[1]
local running = P .. ':running'
local woke = {}
for n = 2, #ARGV, 2 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q', 'pr', 'a')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    local a = tonumber(v[5] or '0')
    redis.call('HSET', jk, 'a', a > 0 and a - 1 or 0, 'u', now)
    redis.call('HDEL', jk, 'tk', 'lu')
    redis.call('ZREM', running, id)
    make_ready(jk, id, v[3], v[4], now)
    count(v[3], 'running', -1)
    woke[v[3]] = true
  end
end
for q in pairs(woke) do
  wake(q, now)
end
flush_counts()
return 0
