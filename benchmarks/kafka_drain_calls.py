"""What a Kafka drain costs per fetch batch: state-store scripts, commits,
the copies judged per lease and the jobs per settle.

    PYTHONPATH=src .venv/bin/python benchmarks/kafka_drain_calls.py [-n 10000]

One drain of ``kafka_drain.py`` (tansu started here, a Redis state store),
with dumbwaiter's own functions wrapped to count (nothing of aiokafka or
redis-py is touched): the Redis scripts run (``Connection.run``, by script),
the offset commits (``Reader.commit``), and per ``jobs.judge`` / ``jobs.settle``
call how many copies it judged, how many it leased and how many jobs it
settled.  The enqueue's own calls are counted too (a few per 1,000 jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
from typing import Any

from kafka_bench import running_tansu
from kafka_drain import drain, url_of

from dumbwaiter.brokers.kafka import jobs, transport
from dumbwaiter.brokers.redis import connection

calls: collections.Counter[str] = collections.Counter()
sizes: dict[str, list[int]] = collections.defaultdict(list)


def count() -> None:
    run, judge, settle = connection.Connection.run, jobs.judge, jobs.settle
    commit = transport.Reader.commit

    async def counted_run(self: Any, script: Any, args: Any) -> Any:
        calls[f"redis {script.name}"] += 1
        return await run(self, script, args)

    async def counted_judge(b: Any, copies: Any, *a: Any, **k: Any) -> Any:
        got = await judge(b, copies, *a, **k)
        sizes["copies judged per judge"].append(len(copies))
        sizes["jobs leased per judge"].append(len(got[0]))
        return got

    async def counted_settle(b: Any, ds: Any, change: Any) -> None:
        sizes["jobs per settle"].append(len(ds))
        await settle(b, ds, change)

    async def counted_commit(self: Any, only: Any = None) -> None:
        calls["offset commits"] += 1
        await commit(self, only)

    connection.Connection.run = counted_run  # type: ignore[method-assign]
    jobs.judge, jobs.settle = counted_judge, counted_settle  # type: ignore[assignment]
    transport.Reader.commit = counted_commit  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10000)
    args = ap.parse_args()
    count()
    with running_tansu() as servers:
        url = url_of("kafka", servers, f"kc{int(time.time())}")
        rate, _ = asyncio.run(drain(url, args.n, None))
    print(f"drain {rate:,.0f}/s ({args.n} jobs)")
    for k, v in sorted(calls.items()):
        print(f"{k}: {v} ({v / args.n:.4f} a job)")
    for k, xs in sizes.items():
        print(f"{k}: {len(xs)} calls, mean {statistics.mean(xs):.1f}, max {max(xs)}")


if __name__ == "__main__":
    main()
