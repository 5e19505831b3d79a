--@include _lib
--@include _kv
-- The write half of kv_update: a compare-and-set over many keys.
-- ARGV: now, n (keys read), then n (key, digest) pairs: the SHA1 hex of the
-- live value the caller read, '' when it read the key as absent; then key,
-- value, expiry triples to store (the expiry an absolute time, as kv_set's;
-- '' = none, which also clears an expiry the key had).  Writes only if
-- every read key still holds what was read (an expired key counts as
-- absent); returns 1 if it wrote, 0 if a key changed (the caller reads and
-- decides again).
--
-- Comparing values (not versions) is enough: the caller's decision is a
-- function of the values alone, so if a key changed and changed back, the
-- decision made on the first value is the decision on the current one.
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, 2 + 2 * n, 2 do
  local v = kv_live(ARGV[i], now)
  local want = ARGV[i + 1]
  if want == '' then
    if v then
      return 0
    end
  elseif not v or redis.sha1hex(v) ~= want then
    return 0
  end
end
for i = 3 + 2 * n, #ARGV, 3 do
  kv_put(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return 1
