--@include _lib
-- Pause (ARGV[3] = '1') or resume ('0') the queue ARGV[2]; ARGV[1] = now.
-- Resuming wakes an idle worker of the queue.
local now, q = ARGV[1], ARGV[2]
redis.call('SADD', P .. ':queues', q)
if ARGV[3] == '1' then
  redis.call('SADD', P .. ':paused', q)
else
  redis.call('SREM', P .. ':paused', q)
  wake(q, now)
end
return 0
