"""What a job's path through the broker seam costs this process, per engine.

For a refactor of an engine that must not make the hot path slower: the
seam's enqueue, fetch and ack, called directly on a broker (no App, no
worker), two ways:

    calls   Python function calls per operation (cProfile's count):
            deterministic, so a refactor that adds a call or an await per
            job shows however loaded the machine is
    cpu     this process's CPU time per job (``time.process_time``), best
            of ``--repeat`` runs: what the calls cost, with the machine's noise

Operations: ``enqueue_sync([m])`` and ``await enqueue([m])`` (the usual
``task.enqueue``), a bulk of ``-n`` jobs both ways, ``fetch(100)`` + ``ack``
and ``fetch(1)`` + ``ack(1)``.  The broker's URL names a namespace of its
own: a Redis ``prefix`` is deleted afterwards (only Redis and memory are
cleaned up; use a throwaway namespace for other engines).

    PYTHONPATH=src python benchmarks/seam_calls.py "redis://127.0.0.1:6379/0?prefix=seam"
    PYTHONPATH=src python benchmarks/seam_calls.py memory:// --mode cpu
    # an older tree side by side, alternated:
    git archive main src | tar -x -C /tmp/dw-main
    PYTHONPATH=/tmp/dw-main/src python benchmarks/seam_calls.py memory://

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import time
from collections.abc import Awaitable, Callable

from dumbwaiter.brokers import Broker, from_url
from dumbwaiter.message import Message, uuid7

QUEUE = "seam-calls"


def jobs(n: int) -> list[Message]:
    return [Message(id=uuid7(), kind="task", name="noop", queue=QUEUE, args=[i]) for i in range(n)]


async def per_call(fn: Callable[[], Awaitable[object]], times: int, mode: str) -> float:
    """Calls (or CPU microseconds) of one ``fn()``, averaged over ``times``."""
    gc.collect()
    if mode == "calls":
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(times):
            await fn()
        prof.disable()
        return pstats.Stats(prof).total_calls / times
    start = time.process_time()
    for _ in range(times):
        await fn()
    return (time.process_time() - start) / times * 1e6


async def measure(broker: Broker, n: int, mode: str, repeat: int) -> dict[str, float]:
    out: dict[str, float] = {}

    async def best(name: str, make: Callable[[], Callable[[], Awaitable[object]]], times: int,
                   per: int = 1) -> None:  # fmt: skip
        runs = [await per_call(make(), times, mode) / per for _ in range(repeat)]
        out[name] = min(runs)

    def one_sync() -> Callable[[], Awaitable[object]]:
        ms = iter(jobs(n))

        async def call() -> object:
            return broker.enqueue_sync([next(ms)])

        return call

    def one_async() -> Callable[[], Awaitable[object]]:
        ms = iter(jobs(n))
        return lambda: broker.enqueue([next(ms)])

    def bulk_sync() -> Callable[[], Awaitable[object]]:
        ms = jobs(n)

        async def call() -> object:
            return broker.enqueue_sync(iter(ms))

        return call

    def bulk_async() -> Callable[[], Awaitable[object]]:
        ms = jobs(n)
        return lambda: broker.enqueue(iter(ms))

    def drain(limit: int) -> Callable[[], Callable[[], Awaitable[object]]]:
        def make() -> Callable[[], Awaitable[object]]:
            async def call() -> object:
                ds = await broker.fetch([QUEUE], limit, 30.0, 0)
                await broker.ack(ds)
                return ds

            return call

        return make

    await broker.enqueue(jobs(1))  # connections open, scripts loaded
    await drain(10)()()
    if broker.capabilities.sync_enqueue:
        await best("enqueue_sync([m])", one_sync, n)
    await best("enqueue([m])", one_async, n)
    await drain_all(broker)
    if broker.capabilities.sync_enqueue:
        await best("enqueue_sync(n), per job", bulk_sync, 1, n)
    await best("enqueue(n), per job", bulk_async, 1, n)
    await drain_all(broker)
    await broker.enqueue(jobs(100 * 10 * repeat))
    await best("fetch(100) + ack, per job", drain(100), 10, 100)
    await broker.enqueue(jobs(n * repeat))
    await best("fetch(1) + ack(1)", drain(1), n)
    await drain_all(broker)
    return out


async def drain_all(broker: Broker) -> None:
    while ds := await broker.fetch([QUEUE], 1000, 30.0, 0):
        await broker.ack(ds)


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("url", help="a broker URL naming a namespace of the run's own")
    ap.add_argument("--mode", choices=("calls", "cpu"), default="calls")
    ap.add_argument("-n", type=int, default=2000, help="jobs per one-at-a-time run and per bulk")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    broker = from_url(a.url)
    await broker.open()
    try:
        figures = await measure(broker, a.n, a.mode, a.repeat)
    finally:
        await broker.close()
        cleanup(a.url)
    print(json.dumps({"mode": a.mode, **{k: round(v, 2) for k, v in figures.items()}}))


def cleanup(url: str) -> None:
    """Delete a Redis prefix's keys (finished jobs stay for the retention)."""
    if not url.startswith(("redis://", "rediss://")) or "prefix=" not in url:
        return
    import redis

    prefix = url.split("prefix=")[1].split("&")[0]
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        for key in client.scan_iter(match="{dw:" + prefix + "}*", count=1000):
            client.delete(key)
    finally:
        client.close()


if __name__ == "__main__":
    asyncio.run(main())
