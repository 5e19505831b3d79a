-- Helpers shared by every script (the loader puts this file in front of a
-- script that says `--@include _lib`).
--
-- KEYS[1] is the app's key prefix, "{dw:NAME}".  Every key a script touches
-- is built from it, so all of an app's keys hash to one Redis Cluster slot and
-- the script runs on the node that owns it.
--
-- Times travel as the decimal strings Python sent (epoch seconds).  They are
-- stored as those strings and turned into numbers only to compare them:
-- Lua's own number-to-string conversion keeps 14 digits and would lose
-- microseconds.
local P = KEYS[1]

local function jkey(id)
  return P .. ':job:' .. id
end

-- A ready job's member in its queue's sorted set.  The score is -priority
-- (higher priority pops first); within one priority members sort bytewise, so
-- the zero-padded microsecond time it became ready, then the id, give
-- oldest-first order.
local function member(ra, id)
  return string.format('%016d', math.floor(tonumber(ra) * 1000000)) .. id
end

-- Idle workers wait in BLPOP on an inbox of their own (`in:<waiter>`), each
-- registered in `waiters:<queue>` (score: when the registration lapses) of
-- every queue it takes, with its worker name, lease and limit in
-- `w:<waiter>`.  take_waiter pops the freshest live one; a waiter is used
-- once (it registers again when it waits again).
local function take_waiter(q, now)
  local wk = P .. ':waiters:' .. q
  while true do
    local top = redis.call('ZPOPMAX', wk)
    if #top == 0 then
      return nil, nil
    end
    if tonumber(top[2]) > now then
      local wh = P .. ':w:' .. top[1]
      local v = redis.call('HMGET', wh, 'worker', 'lease', 'limit')
      if v[1] then
        redis.call('DEL', wh)
        return top[1], v
      end
    end
  end
end

-- Wake one idle worker of the queue (it will claim): ready work appeared
-- that no enqueue handed over (a retry, a rescue, a replay, a resume, more
-- ready jobs than a claim took).
local function wake(q, now)
  local wid = take_waiter(q, tonumber(now))
  if wid then
    redis.call('RPUSH', P .. ':in:' .. wid, 'w')
  end
end

local function make_ready(jk, id, q, pr, ra)
  redis.call('HSET', jk, 'st', 'ready', 'ra', ra)
  redis.call('ZADD', P .. ':ready:' .. q, -tonumber(pr), member(ra, id))
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

-- Per-queue counters of the states that have no set of their own to count,
-- summed in the script and written once per queue.
local deltas = {}
local function count(q, field, n)
  local t = deltas[q]
  if not t then
    t = {}
    deltas[q] = t
  end
  t[field] = (t[field] or 0) + n
end
local function flush_counts()
  for q, t in pairs(deltas) do
    for f, n in pairs(t) do
      if n ~= 0 then
        redis.call('HINCRBY', P .. ':stat:' .. q, f, n)
      end
    end
  end
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
-- set.  `bodies` may be nil (the bodies are read then).
local function offer(q, pr, ra, ids, bodies, now)
  local nnow = tonumber(now)
  local k = 1
  if redis.call('SISMEMBER', P .. ':paused', q) == 0 then
    while k <= #ids do
      local wid, w = take_waiter(q, nnow)
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
        redis.call('HSET', jk, 'st', 'running', 'a', 1, 'tk', token, 'lu', lu, 'w', w[1],
          'ib', wid, 'u', now)
        redis.call('ZADD', P .. ':running', lu, id)
        local body = bodies and bodies[k] or redis.call('HGET', jk, 'body')
        batch[#batch + 1] = {id, q, 1, body, '', token, lu}
        k = k + 1
      end
      count(q, 'running', #batch)
      redis.call('RPUSH', P .. ':in:' .. wid, cjson.encode(batch))
    end
  end
  if k <= #ids then
    local ready = {}
    local score, pre = -tonumber(pr), string.format('%016d', math.floor(tonumber(ra) * 1000000))
    for j = k, #ids do
      ready[#ready + 1] = score
      ready[#ready + 1] = pre .. ids[j]
    end
    redis.call('ZADD', P .. ':ready:' .. q, unpack(ready))
  end
end

-- A bulk enqueue stages its chunks (jobs stored but in no set a worker
-- reads) while it encodes the next ones, then commits them all at once, so
-- a batch whose producer fails half-way is never half visible.  The staged
-- groups are listed in `stage:<call>` (queue, kind, priority, run_at, count,
-- ids...); `staging` holds each call's deadline, after which the rescuer
-- deletes what a dead producer left.  unstage deletes a call's staged jobs.
local function unstage(call)
  local sk = P .. ':stage:' .. call
  local items = redis.call('LRANGE', sk, 0, -1)
  local i = 1
  while i <= #items do
    local n = tonumber(items[i + 4])
    for j = i + 5, i + 4 + n do
      local id = items[j]
      local jk = jkey(id)
      local v = redis.call('HMGET', jk, 'q', 'st', 'a', 'ra', 'pr', 'k')
      if v[2] then
        unlink(jk, id, v[1], v[2], v[3], v[4], v[5])
        forget(jk, id, v[6])
      end
    end
    i = i + 5 + n
  end
  redis.call('DEL', sk)
  redis.call('ZREM', P .. ':staging', call)
end
