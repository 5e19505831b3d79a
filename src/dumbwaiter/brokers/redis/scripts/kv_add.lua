--@include _lib
--@include _kv
-- ARGV: now, key, value, expires_at ('' = never).  Stores only if absent;
-- returns 1 if stored.
if kv_live(ARGV[2], tonumber(ARGV[1])) then
  return 0
end
kv_put(ARGV[2], ARGV[3], ARGV[4])
return 1
