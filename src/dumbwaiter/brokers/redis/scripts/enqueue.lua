--@include _lib
-- Store jobs.  ARGV: now, then 9 per job: id, queue, name, priority, run_at,
-- scheduled ('1'/'0'), max_attempts, key ('' = none), body.
-- Returns each job's id, or the id of the job already stored under the same
-- id or key.  A job is never stored twice, so a producer may send the same
-- batch again after a lost reply.
local now = ARGV[1]
local out = {}
local seen = {}
local woke = {}
local i = 0
for n = 2, #ARGV, 9 do
  i = i + 1
  local id, q, key = ARGV[n], ARGV[n + 1], ARGV[n + 7]
  local jk = jkey(id)
  local held = false
  if redis.call('EXISTS', jk) == 1 then
    held = id
  elseif key ~= '' then
    held = redis.call('HGET', P .. ':keys', key)
  end
  if held then
    out[i] = held
  else
    out[i] = id
    local pr, ra = ARGV[n + 3], ARGV[n + 4]
    if key ~= '' then
      redis.call('HSET', P .. ':keys', key, id)
      redis.call('HSET', jk, 'k', key)
    end
    redis.call('ZADD', P .. ':ids', 0, id)
    if not seen[q] then
      seen[q] = true
      redis.call('SADD', P .. ':queues', q)
    end
    if ARGV[n + 5] == '1' then
      redis.call('HSET', jk, 'body', ARGV[n + 8], 'q', q, 'n', ARGV[n + 2], 'pr', pr,
        'ma', ARGV[n + 6], 'ra', ra, 'u', now, 'st', 'scheduled')
      local sk = P .. ':sched:' .. q
      -- a waiting worker sleeps until the earliest due job: wake it only if
      -- this one is due earlier
      local first = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
      if #first == 0 or tonumber(first[2]) > tonumber(ra) then
        woke[q] = true
      end
      redis.call('ZADD', sk, ra, id)
    else
      redis.call('HSET', jk, 'body', ARGV[n + 8], 'q', q, 'n', ARGV[n + 2], 'pr', pr,
        'ma', ARGV[n + 6], 'ra', ra, 'u', now, 'st', 'ready')
      redis.call('ZADD', P .. ':ready:' .. q, -tonumber(pr), member(ra, id))
      woke[q] = true
    end
  end
end
for q in pairs(woke) do
  wake(q)
end
return out
