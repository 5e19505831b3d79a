--@include _lib
-- Extend a held lock.  ARGV: name, owner, token, now, expires.  Returns 1 if
-- it was still held by this owner and token, else 0.
local lk = P .. ':lock:' .. ARGV[1]
local v = redis.call('HMGET', lk, 'owner', 'token', 'exp')
if v[1] == ARGV[2] and v[2] == ARGV[3] and tonumber(v[3]) > tonumber(ARGV[4]) then
  redis.call('HSET', lk, 'exp', ARGV[5])
  return 1
end
return 0
