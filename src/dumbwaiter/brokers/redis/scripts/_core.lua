-- The helpers every script needs: the key prefix, job keys, ready-set
-- members and the idle workers (the loader puts this file in front of a
-- script that says `--@include _core`; `_lib` includes it).  Kept apart
-- because a script runs all of its helpers' definitions on every call: the
-- hottest scripts (enqueue_one, ack, extend) include only what they use.
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

-- A ready job's score there, as text.  A number passed to redis.call is
-- formatted by the server (snprintf, "%.17g"), which cost about as much as
-- the rest of a ZADD per job; an integer's tostring is exact.  Ids and
-- counts are passed as text ('0', '1') for the same reason.
local function ready_score(pr)
  return tostring(-tonumber(pr))
end

-- Idle workers wait in BLPOP on an inbox of their own (`in:<waiter>`), each
-- registered in `waiters:<queue>` (score: when the registration lapses) of
-- every queue it takes, with its worker name, lease and limit in
-- `w:<waiter>`.  take_waiter pops the freshest live one (and returns its
-- score too); a waiter is used once (it registers again when it waits again).
local function take_waiter(q, now)
  local wk = P .. ':waiters:' .. q
  while true do
    local top = redis.call('ZPOPMAX', wk)
    if #top == 0 then
      return nil, nil, nil
    end
    if tonumber(top[2]) > now then
      local wh = P .. ':w:' .. top[1]
      local v = redis.call('HMGET', wh, 'worker', 'lease', 'limit')
      if v[1] then
        redis.call('DEL', wh)
        return top[1], v, top[2]
      end
    end
  end
end

-- take_waiter for handing jobs over: none while the queue is paused (a
-- waiter that registered before the pause is put back as it was).  The pause
-- is looked up only once a waiter is found, so an enqueue that finds none
-- (the workers are busy, or there are none) costs one call here, not two.
local function take_open_waiter(q, now)
  local wid, w, score = take_waiter(q, now)
  if wid and redis.call('SISMEMBER', P .. ':paused', q) == 1 then
    local wh = P .. ':w:' .. wid
    redis.call('ZADD', P .. ':waiters:' .. q, score, wid)
    redis.call('HSET', wh, 'worker', w[1], 'lease', w[2], 'limit', w[3])
    redis.call('EXPIRE', wh, math.ceil(tonumber(score) - now) + 60)
    return nil, nil
  end
  return wid, w
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
