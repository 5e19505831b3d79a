--@include _lib
--@include _events
-- One page of the log of one event type, oldest first.  ARGV: type, start
-- (an XRANGE start: '-', a millisecond, or '(' .. the cursor), end ('+' or a
-- millisecond), since, until (exact publish times, '' = unbounded), limit.
-- Returns {cursor ('' = no more), then per event: i, t, m, b}.
local k = evkey(ARGV[1])
local start, stop = ARGV[2], ARGV[3]
local since, until_ = tonumber(ARGV[4]), tonumber(ARGV[5])
local limit = tonumber(ARGV[6])
local out = {''}
local last = ''
local found = 0
local looked = 0
while true do
  local entries = redis.call('XRANGE', k, start, stop, 'COUNT', 500)
  if #entries == 0 then
    return out
  end
  for _, e in ipairs(entries) do
    local f = entry_fields(e[2])
    local t = tonumber(f.t)
    if (since == nil or t >= since) and (until_ == nil or t <= until_) then
      if found == limit then
        out[1] = last -- one more than a page: go on after its last event
        return out
      end
      found = found + 1
      last = e[1]
      out[#out + 1] = f.i
      out[#out + 1] = f.t
      out[#out + 1] = f.m
      out[#out + 1] = f.b
    end
    looked = looked + 1
    start = '(' .. e[1]
    if looked >= 10000 then
      -- a long run of entries outside [since, until]: go on in the next call
      out[1] = e[1]
      return out
    end
  end
end
