-- The key-value store: values in the hash `kv`, names in the sorted set
-- `kvn` (one score, so sorted by name: a prefix scan is one range read) and
-- expiry times in `kvx`.  An expired entry is treated as absent at once and
-- deleted here or by the rescue script's sweep.
local KV, KVN, KVX = P .. ':kv', P .. ':kvn', P .. ':kvx'

local function kv_drop(k)
  redis.call('HDEL', KV, k)
  redis.call('ZREM', KVN, k)
  redis.call('ZREM', KVX, k)
end

-- The live value of k (false if absent or expired).
local function kv_live(k, now)
  local e = redis.call('ZSCORE', KVX, k)
  if e and tonumber(e) <= now then
    kv_drop(k)
    return false
  end
  return redis.call('HGET', KV, k)
end

local function kv_put(k, v, expires)
  redis.call('HSET', KV, k, v)
  redis.call('ZADD', KVN, 0, k)
  if expires ~= '' then
    redis.call('ZADD', KVX, expires, k)
  else
    redis.call('ZREM', KVX, k)
  end
end
