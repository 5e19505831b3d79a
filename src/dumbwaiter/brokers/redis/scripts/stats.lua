--@include _lib
--@include _events
-- Counts per known queue.  ARGV: now.  Returns 9 items per queue: name,
-- ready, scheduled (retries included), retrying, running, dead, succeeded,
-- cancelled, paused ('1'/'0'), oldest ready time ('' = none).
-- Ready and scheduled are the sizes of their sets; the other states are
-- counters the transition scripts keep.  The oldest ready job is the first
-- of each priority's run (ready sets sort by priority, then time), at most
-- 32 priorities looked at.  A subscriber group's queue counts its unread
-- events (its consumer groups' lag) as ready too, the oldest of them by
-- publish time.
local out = {}
local queues = redis.call('SMEMBERS', P .. ':queues')
table.sort(queues)
for _, q in ipairs(queues) do
  local rk = P .. ':ready:' .. q
  local c = redis.call('HMGET', P .. ':stat:' .. q, 'retrying', 'running', 'dead', 'succeeded',
    'cancelled')
  local oldest = nil
  local first = redis.call('ZRANGE', rk, 0, 0, 'WITHSCORES')
  local guard = 0
  while #first > 0 and guard < 32 do
    guard = guard + 1
    local t = tonumber(string.sub(first[1], 1, 16))
    if oldest == nil or t < oldest then
      oldest = t
    end
    first = redis.call('ZRANGEBYSCORE', rk, '(' .. first[2], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  end
  local ready = redis.call('ZCARD', rk)
  local n_unread, first_unread = unread(q)
  if n_unread > 0 then
    ready = ready + n_unread
    local us = math.floor(first_unread * 1000000)
    if oldest == nil or us < oldest then
      oldest = us
    end
  end
  out[#out + 1] = q
  out[#out + 1] = ready
  out[#out + 1] = redis.call('ZCARD', P .. ':sched:' .. q)
  for j = 1, 5 do
    out[#out + 1] = c[j] or '0'
  end
  out[#out + 1] = redis.call('SISMEMBER', P .. ':paused', q)
  out[#out + 1] = oldest and string.format('%d', oldest) or ''
end
return out
