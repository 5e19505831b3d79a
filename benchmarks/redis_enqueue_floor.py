"""Issue 25 on Redis: the producer against the bare LPUSH anchor and a job floor.

The harness' anchor is a bare redis-py ``LPUSH`` (one at a time, and in
non-transactional pipelines of 1,000), which stores no job.  A job needs its
record (state, attempts, what the dashboard reads), so this script also
measures a *floor*: a bare redis-py loop doing the least an atomic job
enqueue must do, the same record (the eight fields dumbwaiter's job hash
holds, the same envelope bytes, built with orjson per job) and one push into
the queue's ready sorted set, atomically:

* ``floor-lua``: one ``EVALSHA`` per job of a two-command script (``HSET`` of
  the record, ``ZADD`` of the ready member);
* ``floor-multi``: ``MULTI`` / ``HSET`` / ``ZADD`` / ``EXEC`` per job
  (redis-py's transactional pipeline);
* bulk: the same per chunk of 1,000 jobs, one ``EVALSHA`` of a script looping
  over the chunk (``floor-lua``) or one ``MULTI`` of the chunk's 2,000
  commands (``floor-multi``).

and dumbwaiter's own calls as the harness makes them: ``task.enqueue(i)``
one at a time (W1), ``task.enqueue_many(range(n))`` (W2).  Each repetition
runs every variant once, in an order rotated each repetition; the figures
are medians of jobs/s and the ratios of the same repetitions' medians.
Keys live under ``{dw:floor}`` / ``peers:floor`` of the URL's database and
are deleted between steps (nothing else is flushed).

    flock /tmp/dw-bench.lock env PYTHONPATH=src python benchmarks/redis_enqueue_floor.py \
        [--reps 5] [--n 10000] [--bulk-n 10000] [--url redis://127.0.0.1:6379/1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

import dumbwaiter as dw

PREFIX = "floor"
TAG = "{dw:floor}"
ANCHOR_KEY = "peers:floor"

#: the floor's one-job script: the job's record and its ready member
FLOOR_ONE = b"""
redis.call('HSET', KEYS[1] .. ':job:' .. ARGV[1], 'body', ARGV[2], 'q', ARGV[3], 'n', ARGV[4],
  'pr', ARGV[5], 'ma', ARGV[6], 'ra', ARGV[7], 'u', ARGV[7], 'st', 'ready')
redis.call('ZADD', KEYS[1] .. ':ready:' .. ARGV[3], ARGV[5], ARGV[8])
return 0
"""

#: the floor's chunk script: ARGV q, name, pr, ma, ra, then id, body, member per job
FLOOR_MANY = b"""
local P, q, n, pr, ma, ra = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local rk = P .. ':ready:' .. q
for i = 6, #ARGV, 3 do
  redis.call('HSET', P .. ':job:' .. ARGV[i], 'body', ARGV[i + 1], 'q', q, 'n', n, 'pr', pr,
    'ma', ma, 'ra', ra, 'u', ra, 'st', 'ready')
  redis.call('ZADD', rk, pr, ARGV[i + 2])
end
return 0
"""


def _envelope(id: str, i: int, now: float) -> bytes:
    """An envelope of the shape and size dumbwaiter's encoder writes for the
    harness' ``noop(i)`` (the same keys; the floor builds one per job)."""
    return orjson.dumps(
        {
            "id": id,
            "kind": "task",
            "name": "noop",
            "queue": "default",
            "args": [i],
            "kwargs": {},
            "headers": {},
            "attempt": 0,
            "max_attempts": 4,
            "created_at": now,
            "eta": None,
            "priority": 0,
            "key": None,
            "errors": [],
        }
    )


def _member(ra: float, id: str) -> str:
    return f"{int(ra * 1000000):016d}{id}"


def _clean(r: redis.Redis) -> None:
    keys = [*r.scan_iter(match=f"{TAG}*", count=1000), ANCHOR_KEY]
    for k in range(0, len(keys), 1000):
        r.unlink(*keys[k : k + 1000])


class Bench:
    def __init__(self, url: str, n: int, bulk_n: int) -> None:
        self.r = redis.Redis.from_url(url)
        self.n, self.bulk_n = n, bulk_n
        self.app = dw.App(f"{url}?prefix={PREFIX}")
        self.noop = self.app.task(name="noop")(lambda i: None)
        self.one_sha = self.r.script_load(FLOOR_ONE)
        #: 36-character ids, unique per step: a random prefix and a counter,
        #: the cheapest unique id (dumbwaiter's are uuid7, built per job)
        self.base = ""
        self.many_sha = self.r.script_load(FLOOR_MANY)

    def ids(self, i: int) -> str:
        return f"{self.base}{i:012x}"

    # -- one at a time ------------------------------------------------------
    def one_anchor(self) -> None:
        r = self.r
        for i in range(self.n):
            r.lpush(ANCHOR_KEY, i)

    def one_floor_lua(self) -> None:
        r, sha = self.r, self.one_sha
        for i in range(self.n):
            id, now = self.ids(i), time.time()
            body = _envelope(id, i, now)
            r.evalsha(sha, 1, TAG, id, body, "default", "noop", 0, 4, repr(now), _member(now, id))

    def one_floor_multi(self) -> None:
        r = self.r
        for i in range(self.n):
            id, now = self.ids(i), time.time()
            body, ra = _envelope(id, i, now), repr(now)
            p = r.pipeline(transaction=True)
            p.hset(
                f"{TAG}:job:{id}",
                mapping={
                    "body": body,
                    "q": "default",
                    "n": "noop",
                    "pr": 0,
                    "ma": 4,
                    "ra": ra,
                    "u": ra,
                    "st": "ready",
                },
            )
            p.zadd(f"{TAG}:ready:default", {_member(now, id): 0})
            p.execute()

    def one_ours(self) -> None:
        enqueue = self.noop.enqueue
        for i in range(self.n):
            enqueue(i)

    # -- bulk -----------------------------------------------------------------
    def bulk_anchor(self) -> None:
        r = self.r
        for start in range(0, self.bulk_n, 1000):
            p = r.pipeline(transaction=False)
            for i in range(start, min(start + 1000, self.bulk_n)):
                p.lpush(ANCHOR_KEY, i)
            p.execute()

    def bulk_floor_lua(self) -> None:
        r, sha = self.r, self.many_sha
        for start in range(0, self.bulk_n, 1000):
            now = time.time()
            args: list[Any] = ["default", "noop", 0, 4, repr(now)]
            for i in range(start, min(start + 1000, self.bulk_n)):
                id = self.ids(i)
                args += (id, _envelope(id, i, now), _member(now, id))
            r.evalsha(sha, 1, TAG, *args)

    def bulk_floor_multi(self) -> None:
        r = self.r
        for start in range(0, self.bulk_n, 1000):
            now = time.time()
            ra = repr(now)
            p = r.pipeline(transaction=True)
            for i in range(start, min(start + 1000, self.bulk_n)):
                id = self.ids(i)
                p.hset(
                    f"{TAG}:job:{id}",
                    mapping={
                        "body": _envelope(id, i, now),
                        "q": "default",
                        "n": "noop",
                        "pr": 0,
                        "ma": 4,
                        "ra": ra,
                        "u": ra,
                        "st": "ready",
                    },
                )
                p.zadd(f"{TAG}:ready:default", {_member(now, id): 0})
            p.execute()

    def bulk_ours(self) -> None:
        self.noop.enqueue_many(range(self.bulk_n))

    def timed(self, step: Callable[[], None], n: int) -> float:
        _clean(self.r)
        self.base = os.urandom(12).hex()
        t = time.perf_counter()
        step()
        rate = n / (time.perf_counter() - t)
        _clean(self.r)
        return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="redis://127.0.0.1:6379/1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=10_000, help="jobs one at a time per step")
    ap.add_argument("--bulk-n", type=int, default=10_000, help="jobs per bulk step")
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    b = Bench(a.url, a.n, a.bulk_n)
    b.noop.enqueue(0)  # connect, load the scripts (not timed)
    one = {
        "anchor": b.one_anchor,
        "floor-lua": b.one_floor_lua,
        "floor-multi": b.one_floor_multi,
        "ours": b.one_ours,
    }
    bulk = {
        "anchor": b.bulk_anchor,
        "floor-lua": b.bulk_floor_lua,
        "floor-multi": b.bulk_floor_multi,
        "ours": b.bulk_ours,
    }
    raw: dict[str, dict[str, list[float]]] = {
        "one": {k: [] for k in one},
        "bulk": {k: [] for k in bulk},
    }
    for rep in range(a.reps):
        for kind, steps, n in (("one", one, a.n), ("bulk", bulk, a.bulk_n)):
            names = list(steps)
            names = names[rep % len(names) :] + names[: rep % len(names)]
            for name in names:
                raw[kind][name].append(b.timed(steps[name], n))
        print(
            f"rep {rep + 1}: "
            + "  ".join(
                f"{kind} {name} {raw[kind][name][-1]:,.0f}" for kind in raw for name in raw[kind]
            ),
            flush=True,
        )
    b.app.close()
    out: dict[str, Any] = {"raw": raw}
    for kind, figs in raw.items():
        med = {k: statistics.median(v) for k, v in figs.items()}
        floor_name = max(("floor-lua", "floor-multi"), key=lambda k: med[k])
        out[kind] = {
            "median_jobs_per_s": med,
            "floor": floor_name,
            "ours/anchor": med["ours"] / med["anchor"],
            "floor/anchor": med[floor_name] / med["anchor"],
            "ours/floor": med["ours"] / med[floor_name],
            "ours/anchor by rep": [
                o / x for o, x in zip(figs["ours"], figs["anchor"], strict=True)
            ],
        }
        print(f"{kind}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in med.items()))
        print(
            f"  ours/anchor {out[kind]['ours/anchor']:.2f}  {floor_name}/anchor "
            f"{out[kind]['floor/anchor']:.2f}  ours/{floor_name} {out[kind]['ours/floor']:.2f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
