-- Per-queue counters of the states that have no set of their own to count,
-- summed in the script and written once per queue.
local deltas = {}
local function count(q, field, n)
  local t = deltas[q]
  if not t then
    t = {}
    deltas[q] = t
  end
  t[field] = (t[field] or 0) + n
end
local function flush_counts()
  for q, t in pairs(deltas) do
    for f, n in pairs(t) do
      if n ~= 0 then
        redis.call('HINCRBY', P .. ':stat:' .. q, f, n)
      end
    end
  end
end
