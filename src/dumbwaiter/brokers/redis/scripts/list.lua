--@include _lib
--@include _filter
-- One page of jobs matching a filter, newest first (see _filter.lua).
-- Returns {cursor, then 14 fields per job}; cursor '' means no more pages.
-- It looks for one match beyond `limit`, so a page that ends exactly at the
-- last match says so instead of leading to an empty page.
local out = {''}
local limit = tonumber(ARGV[3])
ARGV[3] = tostring(limit + 1)
local last = ''
local shown = 0
local cursor, found = walk(function(id, _)
  if shown < limit then
    shown = shown + 1
    last = id
    local v = redis.call('HMGET', jkey(id), 'body', 'q', 'st', 'a', 'err', 'ra', 'u', 'w', 'lu',
      'res', 'rp', 'n', 's')
    out[#out + 1] = id
    for j = 1, 13 do
      out[#out + 1] = v[j] or ''
    end
  end
end)
if found > limit then
  out[1] = last
else
  out[1] = cursor
end
return out
