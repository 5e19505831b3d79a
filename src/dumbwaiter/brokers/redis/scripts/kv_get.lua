--@include _lib
--@include _kv
-- ARGV: now, then keys.  Returns one value per key (nil when absent).
local now = tonumber(ARGV[1])
local out = {}
for n = 2, #ARGV do
  out[n - 1] = kv_live(ARGV[n], now)
end
return out
