--@include _lib
--@include _kv
-- ARGV: now, key, amount, expires_at ('' = never; set only when the key is
-- created).  Returns the new value.
local k = ARGV[2]
if kv_live(k, tonumber(ARGV[1])) then
  return redis.call('HINCRBY', KV, k, ARGV[3])
end
kv_put(k, ARGV[3], ARGV[4])
return tonumber(ARGV[3])
