"""What each part of a staged chunk costs the Redis server, per job.

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/cg.%p \\
        redis-server --port 6392 --save '' --appendonly no &
    .venv/bin/python benchmarks/redis_cost_parts.py --port 6392

The W2 batch (10,000 no-op jobs, ``bulk.encode``'s chunks of 1,000) is sent
to small Lua scripts that each do one part of what ``enqueue.lua`` does
when it stages a chunk (the arguments alone, the job hash, the id index,
the ready-set members...), and the server's instructions per job are
counted (callgrind; the redis-server binary has no symbols, so a profile by
function is not to be had, and parts are measured by difference).  Each
script's figure includes the arguments' transport (the first line).
"""

from __future__ import annotations

import argparse
import time

import redis
import redis_bulk_cost

N = redis_bulk_cost.N
HEAD = """
local P = KEYS[1]
local n = 5
local size, q, name, pr, ra, ma = tonumber(ARGV[n]), ARGV[n+1], ARGV[n+2], ARGV[n+3],
  ARGV[n+4], ARGV[n+6]
n = n + 8
local now = ARGV[1]
"""
PARTS = {
    "arguments only (the group header read)": "",
    "a loop over the jobs": "for j = 1, size do local id, b = ARGV[n], ARGV[n+1]; n = n + 2 end",
    "EXISTS of the chunk's job keys": """local jks = {}
for j = 1, size do jks[j] = P .. ':job:' .. ARGV[n]; n = n + 2 end
redis.call('EXISTS', unpack(jks))""",
    "HSET of the 8 fields": """for j = 1, size do
  redis.call('HSET', P .. ':job:' .. ARGV[n], 'body', ARGV[n + 1], 'q', q, 'n', name,
    'pr', pr, 'ma', ma, 'ra', ra, 'u', now, 'st', 'staged')
  n = n + 2
end""",
    "HSET of the body alone": """for j = 1, size do
  redis.call('HSET', P .. ':job:' .. ARGV[n], 'body', ARGV[n + 1]); n = n + 2
end""",
    "HSET of the 7 small fields alone (a listpack)": """for j = 1, size do
  redis.call('HSET', P .. ':job:' .. ARGV[n], 'q', q, 'n', name, 'pr', pr, 'ma', ma,
    'ra', ra, 'u', now, 'st', 'staged')
  n = n + 2
end""",
    "SET of the body (a string key)": """for j = 1, size do
  redis.call('SET', P .. ':job:' .. ARGV[n], ARGV[n + 1]); n = n + 2
end""",
    "the 8-field HSET, then the commit's HSET st": """for j = 1, size do
  local jk = P .. ':job:' .. ARGV[n]
  redis.call('HSET', jk, 'body', ARGV[n + 1], 'q', q, 'n', name, 'pr', pr, 'ma', ma,
    'ra', ra, 'u', now, 'st', 'staged')
  redis.call('HSET', jk, 'st', 'ready')
  n = n + 2
end""",
    "ZADD of the id index": """local ids = {}
for j = 1, size do ids[2*j-1] = '0'; ids[2*j] = ARGV[n]; n = n + 2 end
redis.call('ZADD', P .. ':ids', unpack(ids))""",
    "the ready-set members: built, ZADD": """local m = {}
local pre = string.format('%016d', math.floor(tonumber(ra) * 1000000))
for j = 1, size do m[2*j-1] = '0'; m[2*j] = pre .. ARGV[n]; n = n + 2 end
redis.call('ZADD', P .. ':m', unpack(m))""",
    "RPUSH of the ids (the stage list)": """local ids = {}
for j = 1, size do ids[j] = ARGV[n]; n = n + 2 end
redis.call('RPUSH', P .. ':l', unpack(ids))""",
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--port", type=int, default=6392)
    a = ap.parse_args()
    r = redis.Redis(port=a.port)
    chunks = redis_bulk_cost.w2_chunks(a.port)
    count = redis_bulk_cost.callgrind_counter(a.port)
    for name, body in PARTS.items():
        r.flushall()
        sha = r.script_load(HEAD + body + "\nreturn 0")
        count()
        for ch in chunks:
            r.evalsha(
                sha, 1, redis_bulk_cost.PREFIX, repr(time.time()), b"stage", "c", "", *ch.args
            )
        print(f"{count() / N:>9,.0f}  {name}")


if __name__ == "__main__":
    main()
