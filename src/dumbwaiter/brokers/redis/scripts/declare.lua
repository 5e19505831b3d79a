--@include _lib
-- Make queues known (stats list them before their first job).  ARGV: queues.
for n = 1, #ARGV do
  redis.call('SADD', P .. ':queues', ARGV[n])
end
return 0
