--@include _lib
-- Give up a lock.  ARGV: name, owner, token.  A stale owner changes nothing.
local lk = P .. ':lock:' .. ARGV[1]
local v = redis.call('HMGET', lk, 'owner', 'token')
if v[1] == ARGV[2] and v[2] == ARGV[3] then
  redis.call('DEL', lk)
end
return 0
