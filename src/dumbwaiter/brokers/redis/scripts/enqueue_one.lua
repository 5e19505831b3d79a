--@include _core
-- Store one job without a key and publish it at once: the usual
-- `task.enqueue`.  The same effect as enqueue.lua with a group of one, in
-- fewer calls (each call a script makes costs the server more than the
-- command itself): no tables, and a job handed to an idle worker is written
-- once, leased, instead of stored ready and then leased.
-- ARGV: now, queue, name, priority, run_at, max_attempts, id, body, then for
-- a job ready now (run_at is now) its ready-set score and member, built by
-- the caller as member and ready_score in _core.lua make them (Lua's number
-- formatting is dear on the server; docs/benchmarks-redis.md, issue 25).  A
-- run_at other than now is a job scheduled for later.
-- Returns an empty list, as enqueue.lua does when every job has its own id;
-- a job already stored under this id (a producer sending again after a lost
-- reply) is left as it is, unless a bulk enqueue only staged it: then this
-- enqueue stores it as its own, now (see claim_staged in _lib.lua; the same
-- lines here, as this script includes only _core).
local now, q, name, pr, ra, ma, id, body = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  ARGV[6], ARGV[7], ARGV[8]
local jk = jkey(id)
local st = redis.call('HGET', jk, 'st') -- one call, as EXISTS was: a stored job has a state
if st then
  if st ~= 'staged' then
    return {}
  end
  local calls = redis.call('ZRANGE', P .. ':staging', 0, -1)
  for _, c in ipairs(calls) do
    redis.call('HSET', P .. ':stagedirty', c, 1)
  end
end
redis.call('ZADD', P .. ':ids', '0', id)
redis.call('SADD', P .. ':queues', q)
if ra ~= now then
  local sk = P .. ':sched:' .. q
  local first = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
  redis.call('HSET', jk, 'body', body, 'q', q, 'n', name, 'pr', pr, 'ma', ma, 'ra', ra,
    'u', now, 'st', 'scheduled')
  redis.call('ZADD', sk, ra, id)
  -- waiting workers sleep until the earliest due job: wake one if this one
  -- is due earlier
  if #first == 0 or tonumber(first[2]) > tonumber(ra) then
    wake(q, now)
  end
  return {}
end
-- ready: an idle worker of the queue gets it, leased, in its inbox (see
-- offer in _lib.lua); else it waits in the ready set
local nnow = tonumber(now)
local wid, w = take_open_waiter(q, nnow)
if wid then
  local token = redis.call('INCR', P .. ':fence')
  local lu = nnow + tonumber(w[2])
  redis.call('HSET', jk, 'body', body, 'q', q, 'n', name, 'pr', pr, 'ma', ma, 'ra', ra,
    'u', now, 'st', 'running', 'a', '1', 'tk', token, 'lu', lu, 'w', w[1], 'ib', wid)
  redis.call('ZADD', P .. ':running', lu, id)
  redis.call('HINCRBY', P .. ':stat:' .. q, 'running', '1')
  redis.call('RPUSH', P .. ':in:' .. wid, cjson.encode({{id, q, 1, body, '', token, lu}}))
else
  redis.call('HSET', jk, 'body', body, 'q', q, 'n', name, 'pr', pr, 'ma', ma, 'ra', ra,
    'u', now, 'st', 'ready')
  redis.call('ZADD', P .. ':ready:' .. q, ARGV[9], ARGV[10])
end
return {}
