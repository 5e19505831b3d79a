--@include _lib
--@include _kv
-- ARGV: now, prefix.  Returns key, value pairs of every live entry whose key
-- starts with the prefix (names are UTF-8, which never holds the byte 0xff,
-- so "(prefix\xff" bounds the range).
local now, prefix = tonumber(ARGV[1]), ARGV[2]
local lo, hi = '-', '+'
if prefix ~= '' then
  lo, hi = '[' .. prefix, '(' .. prefix .. '\255'
end
local out = {}
for _, k in ipairs(redis.call('ZRANGEBYLEX', KVN, lo, hi)) do
  local v = kv_live(k, now)
  if v then
    out[#out + 1] = k
    out[#out + 1] = v
  end
end
return out
