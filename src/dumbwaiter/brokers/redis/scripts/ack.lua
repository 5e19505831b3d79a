--@include _core
--@include _counts
-- Mark leased jobs succeeded.  ARGV: now, then 5 per job: id, token,
-- expires_at (pruned then), result ('' = none kept), started ('' = keep the
-- whole record; else the job is a task that keeps no result: compact it).
-- A job whose lease this token no longer holds is left alone (it was rescued
-- and maybe fetched again), so acking twice or late changes nothing.
--
-- Compact record: a succeeded task without `keep_result` keeps only what its
-- status, the listing and the id's de-duplication read: a hash of its state,
-- queue, task, attempt, when it started and finished (`st q n a s u`; no body, errors,
-- result), out of `ids` and `done` (a sorted-set member costs about as much
-- as the hash), its id appended to `fin`, the list the rescuer prunes from
-- the head (in finishing order) and the listing reads from the tail.  A job
-- holding a unique key (`k`) keeps its whole record, so the key is freed
-- when it is pruned, as before.
local now = ARGV[1]
local running, done = P .. ':running', P .. ':done'
for n = 2, #ARGV, 5 do
  local id = ARGV[n]
  local jk = jkey(id)
  local v = redis.call('HMGET', jk, 'st', 'tk', 'q', 'k', 'n', 'a', 'rp')
  if v[1] == 'running' and v[2] == ARGV[n + 1] then
    if ARGV[n + 4] ~= '' and not v[4] then
      redis.call('DEL', jk)
      redis.call('HSET', jk, 'st', 'succeeded', 'q', v[3], 'n', v[5], 'a', v[6] or '1', 's',
        ARGV[n + 4], 'u', now)
      if v[7] then -- replayed from the dead letters: how often stays shown
        redis.call('HSET', jk, 'rp', v[7])
      end
      redis.call('ZREM', P .. ':ids', id)
      redis.call('RPUSH', P .. ':fin', id)
    else
      redis.call('HSET', jk, 'st', 'succeeded', 'u', now, 'x', ARGV[n + 2])
      redis.call('HDEL', jk, 'tk', 'lu')
      if ARGV[n + 3] ~= '' then
        redis.call('HSET', jk, 'res', ARGV[n + 3])
      end
      redis.call('ZADD', done, ARGV[n + 2], id)
    end
    redis.call('ZREM', running, id)
    count(v[3], 'running', -1)
    count(v[3], 'succeeded', 1)
  end
end
flush_counts()
return 0
