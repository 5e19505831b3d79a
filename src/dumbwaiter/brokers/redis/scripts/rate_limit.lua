--@include _lib
-- Take the permit of a sliding-window rate limit (see dumbwaiter.flow.window_wait,
-- the rule this ports).  ARGV: key, rate, per, at, at - per, at + per,
-- at - 2 per (as exact decimal strings), a unique member for the permit.
-- Permits live in `rate:<key>` by time; those far behind any open window are
-- dropped.  Returns "0" when taken, else the seconds until one would be.
local rk = P .. ':rate:' .. ARGV[1]
local rate, per, at = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', rk, '-inf', ARGV[7])
local near = redis.call('ZRANGEBYSCORE', rk, '(' .. ARGV[5], '(' .. ARGV[6], 'WITHSCORES')
local t = {}
for i = 2, #near, 2 do
  t[#t + 1] = tonumber(near[i])
end
-- the windows (x - per, x] holding `at` are those ending at `at` and at each
-- later permit; count each with two pointers over the sorted times
local xs = {at}
for _, e in ipairs(t) do
  if e > at then
    xs[#xs + 1] = e
  end
end
local upto, after = 0, 0 -- permits <= x, permits <= x - per
local allowed = true
for _, x in ipairs(xs) do
  while upto < #t and t[upto + 1] <= x do
    upto = upto + 1
  end
  while after < #t and t[after + 1] <= x - per do
    after = after + 1
  end
  if upto - after + 1 > rate then
    allowed = false
    break
  end
end
if allowed then
  redis.call('ZADD', rk, ARGV[4], ARGV[8])
  redis.call('PEXPIRE', rk, math.ceil(2 * per * 1000) + 60000)
  return '0'
end
local before = {}
for _, e in ipairs(t) do
  if e < at then
    before[#before + 1] = e
  end
end
if #before >= rate then
  return tostring(math.max(before[#before - rate + 1] + per - at, 1e-6))
end
return tostring(per / rate)
