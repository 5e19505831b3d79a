--@include _lib
-- Store jobs.  ARGV: now, mode, call, deadline, then groups of jobs that
-- share their queue, task, priority, run time and attempts (a bulk enqueue is
-- one group):
--   count, queue, name, priority, run_at, scheduled ('1'/'0'), max_attempts,
--   keyed ('1'/'0'), then per job: id, [key, unique,] body.
-- `unique` says while a stored job with the same key blocks a new one:
-- '' for as long as it is stored, 'active' while it is queued or running,
-- 'queued' while it is queued.  A holder that no longer blocks gives its key
-- to the new job.
-- mode '' stores and publishes at once; 'stage' (first chunk: 'stage1',
-- which registers the call until `deadline`) stores the jobs in state
-- `staged` for commit.lua to publish (see _lib.lua, unstage).
-- mode 'bound' (one chunk only) stores as '' does after checking the
-- bounded queues `call` names (below; brokers/redis/capacity.py).
-- Returns, for each job that was not stored because another job with the same
-- key is (its key still blocks), the job's position in the call (1-based) and
-- that other job's id; an empty list when every job has its own id (stored
-- now, or by an earlier send of the same batch).  The reply of a chunk of a
-- bulk enqueue is thus nearly always empty, not a thousand ids the producer
-- already knows.  A job is never stored twice, so a producer may send the
-- same batch again after a lost reply.  A staging call also names, by its
-- position and its own id, each job that another open bulk enqueue has
-- staged: that one is published only if the other commits, so the producer
-- sends it again the plain way once its own batch is committed (bulk.py),
-- which claims it (see claim_staged in _lib.lua) or finds it stored.
--
-- Ready jobs go straight to idle workers when some wait on the queue: each
-- waiter gets up to its limit of them, leased to it (attempt 1, a fencing
-- token, its lease), in its inbox, so it starts them without another round
-- trip.  The rest wait in the queue's ready set.
-- (`staged` counts as queued: bulk.py stages no keyed job, but a staged
-- holder must block as the ready or scheduled job it becomes.)
local BLOCKS = {
  active = {staged = true, scheduled = true, ready = true, running = true},
  queued = {staged = true, scheduled = true, ready = true},
}
local now, mode, call = ARGV[1], ARGV[2], ARGV[3]
local out = {}
local queues = P .. ':queues'
local stage = nil
if mode == 'stage1' then
  redis.call('ZADD', P .. ':staging', ARGV[4], call)
  mode = 'stage'
elseif mode == 'stage' and not redis.call('ZSCORE', P .. ':staging', call) then
  return redis.error_reply('STAGEGONE staged batch ' .. call .. ' expired')
end
if mode == 'stage' then
  stage = P .. ':stage:' .. call
end
if mode == 'bound' then
  -- a bounded enqueue (capacity.py): `call` holds "queue\nlimit\n" per
  -- bounded queue; the queue's waiting jobs (ready, and scheduled with its
  -- retries) plus this call's must stay within the limit, else nothing is
  -- stored and the reply is QUEUEFULL with the count, the queue's name last
  local adding = {}
  local m = 5
  while m <= #ARGV do
    local size, q = tonumber(ARGV[m]), ARGV[m + 1]
    adding[q] = (adding[q] or 0) + size
    m = m + 8 + size * (ARGV[m + 7] == '1' and 4 or 2)
  end
  for q, limit in string.gmatch(call, '([^\n]+)\n(%d+)\n') do
    local asked = adding[q]
    if asked then
      local have = redis.call('ZCARD', P .. ':ready:' .. q) + redis.call('ZCARD', P .. ':sched:' .. q)
      if have + asked > tonumber(limit) then
        return redis.error_reply('QUEUEFULL ' .. have .. ' ' .. q)
      end
    end
  end
  mode = ''
end
local n = 5
local pos = 0
while n <= #ARGV do
  local size, q, name, pr, ra = tonumber(ARGV[n]), ARGV[n + 1], ARGV[n + 2], ARGV[n + 3],
    ARGV[n + 4]
  local sched, ma, keyed = ARGV[n + 5] == '1', ARGV[n + 6], ARGV[n + 7] == '1'
  n = n + 8
  local step = keyed and 4 or 2
  local jks = {}
  for j = 0, size - 1 do
    jks[j + 1] = jkey(ARGV[n + j * step])
  end
  -- one EXISTS for the group: when none is stored (the usual case) the
  -- per-job check is skipped
  local any = redis.call('EXISTS', unpack(jks)) > 0
  -- counted, not measured with `#` (a search per use), for every job
  local ids, fresh, bodies = {}, {}, {}
  local nids, nfresh = 0, 0
  local sk = P .. ':sched:' .. q
  local first = nil
  if sched then
    first = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
  end
  if not any and not keyed and (stage or not sched) then
    -- new jobs without keys, staged (a bulk enqueue's chunk) or ready (a
    -- batch of up to 1,000): nothing to look at per job, so the loop does
    -- only what each job needs
    local st = stage and 'staged' or 'ready'
    local give = not stage -- offer hands the bodies to idle workers
    for j = 1, size do
      local id, body = ARGV[n], ARGV[n + 1]
      redis.call('HSET', jks[j], 'body', body, 'q', q, 'n', name, 'pr', pr, 'ma', ma,
        'ra', ra, 'u', now, 'st', st)
      n = n + 2
      ids[2 * j - 1] = '0'
      ids[2 * j] = id
      fresh[j] = id
      if give then
        bodies[j] = body
      end
    end
    nids, nfresh, pos = 2 * size, size, pos + size
  else
    for j = 1, size do
      local id, key, unique, body = ARGV[n], '', '', ARGV[n + step - 1]
      if keyed then
        key, unique = ARGV[n + 1], ARGV[n + 2]
      end
      n = n + step
      local jk = jks[j]
      local held = false
      local claim, again = false, false
      if any and redis.call('EXISTS', jk) == 1 then
        -- staged by a bulk enqueue not committed yet: a plain enqueue stores
        -- it as its own, now (see claim_staged in _lib.lua); a staging call
        -- names it in its reply, to be sent again after its commit
        local staged = redis.call('HGET', jk, 'st') == 'staged'
        claim = staged and not stage
        again = staged and stage
        held = not claim and id
      end
      if not held and key ~= '' then
        held = redis.call('HGET', P .. ':keys', key)
        if held == id then
          held = false -- the staged job being claimed holds its own key
        elseif held and unique ~= '' then
          local st = redis.call('HGET', jkey(held), 'st')
          if not BLOCKS[unique][st] then
            redis.call('HDEL', jkey(held), 'k') -- its key no longer blocks: free it
            held = false
          end
        end
      end
      pos = pos + 1
      if held then
        if held ~= id or again then
          out[#out + 1] = pos
          out[#out + 1] = held
        end
      else
        if claim then
          claim_staged()
        end
        redis.call('HSET', jk, 'body', body, 'q', q, 'n', name, 'pr', pr, 'ma', ma, 'ra', ra,
          'u', now, 'st', stage and 'staged' or (sched and 'scheduled' or 'ready'))
        if key ~= '' then
          redis.call('HSET', P .. ':keys', key, id)
          redis.call('HSET', jk, 'k', key)
        end
        ids[nids + 1] = '0'
        ids[nids + 2] = id
        nids = nids + 2
        if sched and not stage then
          redis.call('ZADD', sk, ra, id)
        else
          nfresh = nfresh + 1
          fresh[nfresh] = id
          if not stage then -- offer hands the bodies to idle workers
            bodies[nfresh] = body
          end
        end
      end
    end
  end
  if nids > 0 then
    redis.call('ZADD', P .. ':ids', unpack(ids))
    redis.call('SADD', queues, q)
  end
  if stage then
    if nfresh > 0 and sched then
      redis.call('RPUSH', stage, q, 's', pr, ra, nfresh, unpack(fresh))
    elseif nfresh > 0 and redis.call('ZCARD', P .. ':ready:' .. q) > MOVE_WHOLE then
      -- a backlog: merging a whole set into it would cost more than adding
      -- these members to it one by one, which the commit does (kind 'r')
      redis.call('RPUSH', stage, q, 'r', pr, ra, nfresh, unpack(fresh))
    elseif nfresh > 0 then
      -- ready jobs (kind 'R'): their ready-set members wait in the call's
      -- own set of the queue, which the commit moves whole (see publish_staged
      -- in _lib.lua): this work is done here, while the producer encodes the
      -- next chunk, not in the commit, which nothing overlaps
      redis.call('RPUSH', stage, q, 'R', pr, ra, nfresh, unpack(fresh))
      local members = {}
      local score, pre = ready_score(pr), string.format('%016d', math.floor(tonumber(ra) * 1000000))
      for j = 1, nfresh do
        members[2 * j - 1] = score
        members[2 * j] = pre .. fresh[j]
      end
      local zk = staged_members(call, q)
      redis.call('ZADD', zk, unpack(members))
    end
  elseif nfresh > 0 then
    offer(q, pr, ra, fresh, bodies, now)
  elseif sched and nids > 0 and (#first == 0 or tonumber(first[2]) > tonumber(ra)) then
    -- waiting workers sleep until the earliest due job: wake one if these
    -- are due earlier
    wake(q, now)
  end
end
flush_counts()
return out
