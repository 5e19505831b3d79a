--@include _lib
-- Concurrency slots: `slot:<key>` holds each holder's expiry time.
-- ARGV[1] = op:
--   'acquire' key limit holder now expires -> 1 if taken (or already held), 0
--   'extend' expires, then key, holder pairs (only holds still held)
--   'release' then key, holder pairs
-- Expired holds free their slot, so a crashed worker cannot keep one.
local op = ARGV[1]
if op == 'acquire' then
  local sk = P .. ':slot:' .. ARGV[2]
  redis.call('ZREMRANGEBYSCORE', sk, '-inf', ARGV[5])
  if not redis.call('ZSCORE', sk, ARGV[4])
    and redis.call('ZCARD', sk) >= tonumber(ARGV[3]) then
    return 0
  end
  redis.call('ZADD', sk, ARGV[6], ARGV[4])
  return 1
elseif op == 'extend' then
  for n = 3, #ARGV, 2 do
    redis.call('ZADD', P .. ':slot:' .. ARGV[n], 'XX', ARGV[2], ARGV[n + 1])
  end
else
  for n = 2, #ARGV, 2 do
    redis.call('ZREM', P .. ':slot:' .. ARGV[n], ARGV[n + 1])
  end
end
return 0
