--@include _lib
--@include _kv
-- ARGV: now, then keys.  Returns how many were live.
local now = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  if kv_live(ARGV[i], now) then
    n = n + 1
  end
  kv_drop(ARGV[i])
end
return n
