--@include _lib
--@include _kv
-- ARGV: expires_at ('' = never), then key, value pairs.  Overwrites.
for n = 2, #ARGV, 2 do
  kv_put(ARGV[n], ARGV[n + 1], ARGV[1])
end
return 0
