--@include _core
-- Heartbeat: push leases to a new end.  ARGV: lease_until, then 2 per job:
-- id, token.  Returns the positions (1-based) of the jobs whose lease this
-- token no longer holds.
local lease_until = ARGV[1]
local running = P .. ':running'
local lost = {}
local i = 0
for n = 2, #ARGV, 2 do
  i = i + 1
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    redis.call('HSET', jk, 'lu', lease_until)
    redis.call('ZADD', running, lease_until, id)
  else
    lost[#lost + 1] = i
  end
end
return lost
