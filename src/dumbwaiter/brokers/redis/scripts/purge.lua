--@include _lib
--@include _filter
-- Delete matching jobs that are not running (see _filter.lua for ARGV).
-- Returns {cursor, count}: call again with the cursor until it is ''.
local n = 0
local cursor = walk(function(id, v)
  if v[3] == 'running' then
    return
  end
  local jk = jkey(id)
  unlink(jk, id, v[1], v[3], v[4], v[7], v[8])
  forget(jk, id, v[9])
  n = n + 1
end)
flush_counts()
return {cursor, n}
