--@include _lib
-- Publish a staged bulk enqueue (see _lib.lua, unstage).  ARGV: now, call.
-- Jobs still `staged` (all of them, unless a plain enqueue claimed one) become
-- ready (handed to idle workers or put in their ready set) or scheduled (in
-- their queue's scheduled set); each gets one entry, the one its enqueue
-- gave it.  The ready ones' members were written as they were staged
-- (kind 'R', see enqueue.lua): this script marks each job ready and moves
-- the members whole (publish_staged in _lib.lua), the least work per job,
-- as nothing overlaps a commit.
local now, call = ARGV[1], ARGV[2]
if not redis.call('ZSCORE', P .. ':staging', call) then
  return redis.error_reply('STAGEGONE staged batch ' .. call .. ' expired')
end
local sk = P .. ':stage:' .. call
local items = redis.call('LRANGE', sk, 0, -1)
-- a plain enqueue claimed a staged job meanwhile (see claim_staged): look
-- at each job's state, as when one is gone
local dirty = redis.call('HDEL', P .. ':stagedirty', call) == 1
-- queues with ready jobs staged (kind 'R'), in order, and their member sets
local queues, sets = {}, {}
local i = 1
while i <= #items do
  local q, kind, pr, ra, n = items[i], items[i + 1], items[i + 2], items[i + 3],
    tonumber(items[i + 4])
  local first = i + 5 -- the group's ids: items[first .. first + n - 1]
  i = first + n
  if kind == 'R' then
    local zk = sets[q]
    if not zk then
      zk = staged_members(call, q)
      sets[q] = zk
      queues[#queues + 1] = q
    end
    -- mark each job ready.  Unless the call is dirty, a listed job still
    -- stored is still staged (nothing but this script, unstage and a claim
    -- changes that state, and a claim marks the call dirty), so one HSET per
    -- job is the whole look: it answers 1 (a new field) only for a job that
    -- is gone, whose new hash is deleted at once
    local gone = {}
    for j = first, first + n - 1 do
      local id = items[j]
      local jk = jkey(id)
      local keep
      if dirty then
        keep = redis.call('HGET', jk, 'st') == 'staged'
        if keep then
          redis.call('HSET', jk, 'st', 'ready')
        end
      else
        keep = redis.call('HSET', jk, 'st', 'ready') == 0
        if not keep then
          redis.call('DEL', jk)
        end
      end
      if not keep then
        gone[#gone + 1] = id
      end
    end
    if #gone > 0 then
      -- a plain enqueue took these over (or they are gone): not ours to publish
      local drop = {}
      for k, id in ipairs(gone) do
        drop[k] = member(ra, id)
      end
      redis.call('ZREM', zk, unpack(drop))
    end
  else
    local ids, jks = {}, {}
    for j = 1, n do
      ids[j] = items[first + j - 1]
      jks[j] = jkey(ids[j])
    end
    local nids = n
    -- one EXISTS for the group, as above: else keep only the jobs still staged
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
    if nids == 0 then
      -- nothing of this group to publish
    elseif kind == 'r' then -- a ready set too big to move whole (see enqueue.lua)
      offer(q, pr, ra, ids, nil, now, true)
    else
      local zk = P .. ':sched:' .. q
      local due = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
      local entries = {}
      for k, id in ipairs(ids) do
        redis.call('HSET', jkey(id), 'st', 'scheduled')
        entries[2 * k - 1] = ra
        entries[2 * k] = id
      end
      redis.call('ZADD', zk, unpack(entries))
      if #due == 0 or tonumber(due[2]) > tonumber(ra) then
        wake(q, now)
      end
    end
  end
end
for _, q in ipairs(queues) do
  local zk = sets[q]
  publish_staged(q, zk, redis.call('ZCARD', zk), now)
end
redis.call('DEL', sk)
redis.call('ZREM', P .. ':staging', call)
flush_counts()
return 1
