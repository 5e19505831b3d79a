--@include _lib
-- Pause (ARGV[2] = '1') or resume ('0') the queue ARGV[1].  Resuming wakes
-- the queue's idle workers.
local q = ARGV[1]
redis.call('SADD', P .. ':queues', q)
if ARGV[2] == '1' then
  redis.call('SADD', P .. ':paused', q)
else
  redis.call('SREM', P .. ':paused', q)
  wake(q)
end
return 0
