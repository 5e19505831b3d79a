"""Where a one-at-a-time ``aenqueue`` on RabbitMQ spends its time, next to the
bare confirmed publish to a quorum queue (the issue's anchor).

Alternates, in one process and one event loop, ``N`` bare aiormq publishes
with confirms (``benchmarks/rabbitmq_bare.py``'s one-at-a-time loop) and
``N`` ``await task.aenqueue(i)`` calls (quorum queue, SQLite state store, as
the harness' adapter), and prints per repetition: both rates and their
ratio, the event loop thread's CPU per call (``time.thread_time``) for each,
and the medians of the enqueue's two steps: the record's ``kv_add`` in the
state store and the confirmed publish (``_send``).

    .venv/bin/python benchmarks/rabbitmq_enqueue.py [-n 1000] [--reps 3]
    .venv/bin/python benchmarks/rabbitmq_enqueue.py --profile /tmp/enq.prof  # cProfile the calls

Queues under the prefix ``dwenq`` and ``dw-enq-bare`` (deleted at the end),
the state store in ``/tmp``.  Run it under the benchmarks' flock.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import time
from typing import Any
from urllib.parse import quote

import aiormq
from pamqp import commands as spec

import dumbwaiter as dw
from dumbwaiter.brokers.rabbitmq import topology as topo

AMQP = os.environ.get("DW_ENQ_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
STATE = "/tmp/dwenq-state.db"
BARE_QUEUE = "dw-enq-bare"


async def _bare(ch: aiormq.abc.AbstractChannel, n: int) -> tuple[float, float]:
    props = spec.Basic.Properties(delivery_mode=2)
    cpu, t = time.thread_time(), time.perf_counter()
    for _ in range(n):
        await ch.basic_publish(b"x" * 300, routing_key=BARE_QUEUE, properties=props)
    return n / (time.perf_counter() - t), (time.thread_time() - cpu) / n


def _timed(calls: list[float], fn: Any) -> Any:
    async def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await fn(*a, **kw)
        finally:
            calls.append(time.perf_counter() - t)

    return wrapper


def _fresh_state() -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(STATE + suffix):
            os.unlink(STATE + suffix)


async def main(n: int, reps: int, profile: str | None = None) -> None:
    url = f"{AMQP}?prefix=dwenq&delays=dwenq.delay&state={quote(f'sqlite:///{STATE}', safe='')}"
    app = dw.App(url)

    @app.task(name="noop")
    async def noop(i: int) -> None:
        pass

    await noop.aenqueue(-1)  # connects, declares
    broker: Any = app.broker
    adds: list[float] = []
    sends: list[float] = []
    broker.state.kv_add = _timed(adds, broker.state.kv_add)
    broker._send = _timed(sends, broker._send)
    conn = await aiormq.connect(AMQP)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(BARE_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        for rep in range(1, reps + 1):
            bare, bare_cpu = await _bare(ch, n)
            adds.clear()
            sends.clear()
            prof = cProfile.Profile() if profile else None
            if prof is not None:
                prof.enable()
            cpu, t = time.thread_time(), time.perf_counter()
            for i in range(n):
                await noop.aenqueue(i)
            if prof is not None:
                prof.disable()
                prof.dump_stats(profile)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            rate, dw_cpu = n / (time.perf_counter() - t), (time.thread_time() - cpu) / n
            bare2, bare_cpu2 = await _bare(ch, n)
            anchor = (bare + bare2) / 2
            print(
                f"rep {rep}: bare {bare:,.0f}/{bare2:,.0f}/s, aenqueue {rate:,.0f}/s "
                f"({rate / anchor:.2f} of the bare); loop CPU per call "
                f"{dw_cpu * 1e6:.0f} us (bare {(bare_cpu + bare_cpu2) / 2 * 1e6:.0f}); "
                f"kv_add p50 {statistics.median(adds) * 1e6:.0f} us, "
                f"publish+confirm p50 {statistics.median(sends) * 1e6:.0f} us"
            )
        await ch.queue_delete(BARE_QUEUE)
        # the jobs enqueued (no worker runs them) and the delay cascade: left
        # behind, each run's quorum queue kept growing on the server
        names = broker.names
        for q in [*names.lanes("default"), names.dlq("default")]:
            await ch.queue_delete(q)
        for lvl in range(topo.LEVELS):
            await ch.queue_delete(names.level_queue(lvl))
            await ch.exchange_delete(names.level(lvl))
        await ch.exchange_delete(names.level(-1))
    finally:
        await conn.close()
        await app.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--profile", help="cProfile the aenqueue calls into this file (and print)")
    args = p.parse_args()
    _fresh_state()
    asyncio.run(main(args.n, args.reps, args.profile))
