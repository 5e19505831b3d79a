--@include _lib
--@include _events
-- Make queues known (stats list them before their first job) and bind event
-- types to queues.  ARGV: number of queues, the queues, then 3 per binding:
-- event type, queue, max_attempts.  A new binding creates the queue's
-- consumer group at the end of the type's stream (events published before
-- it stay in the log only); a binding declared again takes its new
-- max_attempts and keeps its place in the stream.
local nq = tonumber(ARGV[1])
for n = 2, nq + 1 do
  redis.call('SADD', P .. ':queues', ARGV[n])
end
for n = nq + 2, #ARGV, 3 do
  local t, q = ARGV[n], ARGV[n + 1]
  redis.call('SADD', P .. ':queues', q)
  redis.call('SADD', P .. ':evtypes', t)
  redis.call('SADD', P .. ':gs:' .. q, t)
  redis.call('HSET', P .. ':bind:' .. t, q, ARGV[n + 2])
  local err = bind_group(t, q)
  if err then
    return err
  end
end
return 0
