--@include _lib
-- Publish a staged bulk enqueue (see _lib.lua, unstage).  ARGV: now, call.
-- Ready jobs go to idle workers or the ready sets, scheduled ones to their
-- queue's scheduled set; a job cancelled meanwhile stays cancelled.
local now, call = ARGV[1], ARGV[2]
if not redis.call('ZSCORE', P .. ':staging', call) then
  return redis.error_reply('STAGEGONE staged batch ' .. call .. ' expired')
end
local sk = P .. ':stage:' .. call
local items = redis.call('LRANGE', sk, 0, -1)
local i = 1
while i <= #items do
  local q, kind, pr, ra, n = items[i], items[i + 1], items[i + 2], items[i + 3],
    tonumber(items[i + 4])
  local want = kind == 's' and 'scheduled' or 'ready'
  local ids = {}
  for j = i + 5, i + 4 + n do
    if redis.call('HGET', jkey(items[j]), 'st') == want then
      ids[#ids + 1] = items[j]
    end
  end
  i = i + 5 + n
  if #ids > 0 then
    if kind == 'r' then
      offer(q, pr, ra, ids, nil, now)
    else
      local zk = P .. ':sched:' .. q
      local first = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
      for _, id in ipairs(ids) do
        redis.call('ZADD', zk, ra, id)
      end
      if #first == 0 or tonumber(first[2]) > tonumber(ra) then
        wake(q, now)
      end
    end
  end
end
redis.call('DEL', sk)
redis.call('ZREM', P .. ':staging', call)
flush_counts()
return 1
