--@include _core
--@include _counts
-- The rest of the helpers shared by the scripts (the loader puts _core,
-- _counts and this file in front of a script that says `--@include _lib`).

local function make_ready(jk, id, q, pr, ra)
  redis.call('HSET', jk, 'st', 'ready', 'ra', ra)
  redis.call('ZADD', P .. ':ready:' .. q, ready_score(pr), member(ra, id))
end

-- Append one error record (JSON text) to the job's error list.
local function append_error(jk, rec, etype)
  if rec == '' then
    return
  end
  local e = redis.call('HGET', jk, 'err')
  if e and e ~= '[]' then
    e = string.sub(e, 1, -2) .. ',' .. rec .. ']'
  else
    e = '[' .. rec .. ']'
  end
  redis.call('HSET', jk, 'err', e, 'et', etype)
end

-- Remove a job from the set that holds it in its current state, keeping the
-- counters right (used by cancel and purge; running jobs are never touched).
local function unlink(jk, id, q, st, a, ra, pr)
  if st == 'ready' then
    redis.call('ZREM', P .. ':ready:' .. q, member(ra, id))
  elseif st == 'scheduled' then
    redis.call('ZREM', P .. ':sched:' .. q, id)
    if tonumber(a or '0') > 0 then
      count(q, 'retrying', -1)
    end
  elseif st == 'dead' then
    redis.call('ZREM', P .. ':dead', id)
    count(q, 'dead', -1)
  elseif st == 'succeeded' or st == 'cancelled' then
    redis.call('ZREM', P .. ':done', id)
    count(q, st, -1)
  end
end

-- Delete a job and every trace of it (purge and pruning).
local function forget(jk, id, k)
  if k and redis.call('HGET', P .. ':keys', k) == id then
    redis.call('HDEL', P .. ':keys', k)
  end
  redis.call('ZREM', P .. ':ids', id)
  redis.call('DEL', jk)
end

-- Ready jobs of one queue, just stored or just committed: idle workers of the
-- queue get them first (each up to its limit, leased to it, in its inbox, so
-- it starts them without another round trip), the rest wait in the ready
-- set.  `bodies` may be nil (the bodies are read then).  `mark`: the jobs are
-- not in state `ready` yet (committed from `staged`): set it on those that go
-- to the ready set (those handed over are written `running` anyway).
local function offer(q, pr, ra, ids, bodies, now, mark)
  local nnow = tonumber(now)
  local k = 1
  while k <= #ids do
    local wid, w = take_open_waiter(q, nnow)
    if not wid then
      break
    end
    local token = redis.call('INCR', P .. ':fence')
    local lu = nnow + tonumber(w[2])
    local batch = {}
    local limit = tonumber(w[3])
    while k <= #ids and #batch < limit do
      local id = ids[k]
      local jk = jkey(id)
      redis.call('HSET', jk, 'st', 'running', 'a', '1', 'tk', token, 'lu', lu, 'w', w[1],
        'ib', wid, 'u', now)
      redis.call('ZADD', P .. ':running', lu, id)
      local body = bodies and bodies[k] or redis.call('HGET', jk, 'body')
      batch[#batch + 1] = {id, q, 1, body, '', token, lu}
      k = k + 1
    end
    count(q, 'running', #batch)
    redis.call('RPUSH', P .. ':in:' .. wid, cjson.encode(batch))
  end
  if k <= #ids then
    local ready = {}
    local score, pre = ready_score(pr), string.format('%016d', math.floor(tonumber(ra) * 1000000))
    for j = k, #ids do
      ready[#ready + 1] = score
      ready[#ready + 1] = pre .. ids[j]
      if mark then
        redis.call('HSET', jkey(ids[j]), 'st', 'ready')
      end
    end
    redis.call('ZADD', P .. ':ready:' .. q, unpack(ready))
  end
end

-- The ready-set members of the ready jobs a bulk enqueue staged for queue
-- `q` (kind 'R' in its stage list): written as the chunks are staged, moved
-- into the queue's ready set whole by the commit.
local function staged_members(call, q)
  return P .. ':stage:' .. call .. ':r:' .. q
end
-- the biggest ready set a staging call adds a set of members to, to be
-- merged whole at the commit (see publish_staged)
local MOVE_WHOLE = 1000

-- Publish the staged ready jobs of queue `q` (`n` of them, their members in
-- `zk`, a set of staged_members): idle workers get the first ones, leased (as
-- offer does), the rest join the ready set in one command when that set is
-- empty or not bigger than these (RENAME, or ZUNIONSTORE then RENAME: no
-- Lua work per job), else by one ZADD of every member.
local function publish_staged(q, zk, n, now)
  local nnow = tonumber(now)
  while n > 0 do
    local wid, w = take_open_waiter(q, nnow)
    if not wid then
      break
    end
    local token = redis.call('INCR', P .. ':fence')
    local lu = nnow + tonumber(w[2])
    local popped = redis.call('ZPOPMIN', zk, tonumber(w[3]))
    local batch = {}
    for j = 2, #popped, 2 do
      local id = string.sub(popped[j - 1], 17)
      local jk = jkey(id)
      redis.call('HSET', jk, 'st', 'running', 'a', '1', 'tk', token, 'lu', lu, 'w', w[1],
        'ib', wid, 'u', now)
      redis.call('ZADD', P .. ':running', lu, id)
      batch[#batch + 1] = {id, q, 1, redis.call('HGET', jk, 'body'), '', token, lu}
    end
    n = n - #batch
    count(q, 'running', #batch)
    redis.call('RPUSH', P .. ':in:' .. wid, cjson.encode(batch))
  end
  local rk = P .. ':ready:' .. q
  if n <= 0 then
    redis.call('DEL', zk)
    return
  end
  local have = redis.call('ZCARD', rk)
  if have > n then
    -- 1,000 members at a time: unpack's limit is 8,000 values
    for from = 0, n - 1, 1000 do
      local m = redis.call('ZRANGE', zk, from, from + 999, 'WITHSCORES')
      local entries = {}
      for j = 2, #m, 2 do
        entries[j - 1] = m[j]
        entries[j] = m[j - 1]
      end
      redis.call('ZADD', rk, unpack(entries))
    end
    redis.call('DEL', zk)
    return
  end
  if have > 0 then
    redis.call('ZUNIONSTORE', zk, 2, zk, rk, 'AGGREGATE', 'MIN')
  end
  redis.call('RENAME', zk, rk)
  redis.call('PERSIST', rk) -- RENAME keeps the staging set's expiry
end

-- A bulk enqueue stages its chunks (jobs stored but in no set a worker
-- reads) while it encodes the next ones, then commits them all at once, so
-- a batch whose producer fails half-way is never half visible.  The staged
-- groups are listed in `stage:<call>` (queue, kind, priority, run_at, count,
-- ids...); `staging` holds each call's deadline, after which the rescuer
-- deletes what a dead producer left.  unstage deletes a call's staged jobs.
--
-- A staged job is in state `staged`, which means "not enqueued yet": no
-- script but commit, unstage and a plain enqueue's claim (below) changes
-- it (get and the admin walks do not see it, cancel and reschedule pass it
-- by), so the commit publishes each job exactly once, where its enqueue put
-- it, and the undo never deletes a job that something else made visible.  (When staged jobs were `ready`, a
-- reschedule to now made one ready and the commit made it ready a second
-- time, with another ready-set member: two workers could lease it at once.)
--
-- A plain enqueue (mode '', or enqueue_one.lua) of an id that a bulk
-- enqueue has staged stores the job as its own, at once: its caller is told
-- the job is enqueued, so it must not depend on the bulk's commit, nor be
-- deleted by the bulk's undo.  The job leaves `staged` (unstage passes it
-- by, the commit does not publish it a second time), and every open bulk
-- call is marked in `stagedirty` (which one staged it is not recorded; a
-- claim is rare and open calls are few), so its commit checks each listed
-- job's state instead of trusting that all are still staged.
local function claim_staged()
  local calls = redis.call('ZRANGE', P .. ':staging', 0, -1)
  if #calls > 0 then
    local marks = {}
    for k, c in ipairs(calls) do
      marks[2 * k - 1] = c
      marks[2 * k] = 1
    end
    redis.call('HSET', P .. ':stagedirty', unpack(marks))
  end
end

local function unstage(call)
  local sk = P .. ':stage:' .. call
  local items = redis.call('LRANGE', sk, 0, -1)
  local i = 1
  while i <= #items do
    local n = tonumber(items[i + 4])
    for j = i + 5, i + 4 + n do
      local id = items[j]
      local jk = jkey(id)
      local v = redis.call('HMGET', jk, 'st', 'k')
      if v[1] == 'staged' then
        forget(jk, id, v[2]) -- in no set, no counter: only its traces to delete
      end
    end
    if items[i + 1] == 'R' then
      redis.call('DEL', staged_members(call, items[i]))
    end
    i = i + 5 + n
  end
  redis.call('DEL', sk)
  redis.call('ZREM', P .. ':staging', call)
  redis.call('HDEL', P .. ':stagedirty', call)
end
