--@include _lib
-- Take the lock ARGV[1] for owner ARGV[2] until ARGV[4] (now = ARGV[3]) if it
-- is free, expired or already this owner's.  Returns the fencing token (it
-- grows with every change of owner, across every lock of the app), or nil.
local lk = P .. ':lock:' .. ARGV[1]
local owner, now, expires = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local v = redis.call('HMGET', lk, 'owner', 'token', 'exp')
if v[1] and tonumber(v[3]) > now then
  if v[1] ~= owner then
    return false
  end
  redis.call('HSET', lk, 'exp', expires)
  return tonumber(v[2])
end
local token = redis.call('INCR', P .. ':lockfence')
redis.call('HSET', lk, 'owner', owner, 'token', token, 'exp', expires)
return token
