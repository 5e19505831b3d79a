--@include _lib
-- Delete what a bulk enqueue staged (its producer gave up).  ARGV: call.
unstage(ARGV[1])
flush_counts()
return 1
