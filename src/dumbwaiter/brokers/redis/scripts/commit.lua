--@include _lib
-- Publish a staged bulk enqueue (see _lib.lua, unstage).  ARGV: now, call.
-- Jobs still `staged` (all of them, unless a plain enqueue claimed one) become
-- ready (handed to idle workers or put in their ready set) or scheduled (in
-- their queue's scheduled set); each gets one entry, the one its enqueue
-- gave it.
local now, call = ARGV[1], ARGV[2]
if not redis.call('ZSCORE', P .. ':staging', call) then
  return redis.error_reply('STAGEGONE staged batch ' .. call .. ' expired')
end
local sk = P .. ':stage:' .. call
local items = redis.call('LRANGE', sk, 0, -1)
-- a plain enqueue claimed a staged job meanwhile (see claim_staged): look
-- at each job's state, as when one is gone
local dirty = redis.call('HDEL', P .. ':stagedirty', call) == 1
local i = 1
while i <= #items do
  local q, kind, pr, ra, n = items[i], items[i + 1], items[i + 2], items[i + 3],
    tonumber(items[i + 4])
  local ids, jks = {}, {}
  for j = 1, n do
    ids[j] = items[i + 4 + j]
    jks[j] = jkey(ids[j])
  end
  local nids = n
  -- one EXISTS for the group: a listed job still stored is still staged
  -- (nothing but this script, unstage and a claim changes that state, and a
  -- claim marks the call dirty), so the usual case needs no per-job look;
  -- else keep only the jobs still staged
  if dirty or redis.call('EXISTS', unpack(jks)) ~= n then
    local still = {}
    nids = 0
    for j = 1, n do
      if redis.call('HGET', jks[j], 'st') == 'staged' then
        nids = nids + 1
        still[nids] = ids[j]
      end
    end
    ids = still
  end
  i = i + 5 + n
  if nids > 0 then
    if kind == 'r' then
      offer(q, pr, ra, ids, nil, now, true)
    else
      local zk = P .. ':sched:' .. q
      local first = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
      local entries = {}
      for k, id in ipairs(ids) do
        redis.call('HSET', jkey(id), 'st', 'scheduled')
        entries[2 * k - 1] = ra
        entries[2 * k] = id
      end
      redis.call('ZADD', zk, unpack(entries))
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
