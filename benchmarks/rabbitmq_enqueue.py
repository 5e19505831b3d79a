"""Where a one-at-a-time ``aenqueue`` on RabbitMQ spends its time, next to the
bare confirmed publish to a quorum queue (the issue's anchor).

Alternates, in one process and one event loop, ``N`` bare aiormq publishes
with confirms (``benchmarks/rabbitmq_bare.py``'s one-at-a-time loop), ``N``
bare aio-pika publishes (the harness' ``aio_pika_quorum_confirm_1by1_per_s``
loop: the issue's anchor, "the bare aio-pika client with confirms") and
``N`` ``await task.aenqueue(i)`` calls (quorum queue, SQLite state store, as
the harness' adapter), each on an empty quorum queue, and prints per repetition: the rates and the
enqueue's ratio to each bare client (its mean of the runs before and after),
the event loop thread's CPU per call (``time.thread_time``) for each,
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
import contextlib
import cProfile
import inspect
import os
import pstats
import statistics
import time
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq
from pamqp import commands as spec

import dumbwaiter as dw
from dumbwaiter.brokers.rabbitmq import announce
from dumbwaiter.brokers.rabbitmq import topology as topo
from dumbwaiter.brokers.rabbitmq.link import AmqpLink

AMQP = os.environ.get("DW_ENQ_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
STATE = "/tmp/dwenq-state.db"
BARE_QUEUE = "dw-enq-bare"
PIKA_QUEUE = "dw-enq-pika"
FLOOR_QUEUE = "dw-enq-floor"
FLOOR_DB = "/tmp/dwenq-floor.db"
#: about the size of a no-op job's record in the state store
RECORD = b"r" * 480


async def _bare(ch: aiormq.abc.AbstractChannel, n: int) -> tuple[float, float]:
    props = spec.Basic.Properties(delivery_mode=2)
    cpu, t = time.thread_time(), time.perf_counter()
    for _ in range(n):
        await ch.basic_publish(b"x" * 300, routing_key=BARE_QUEUE, properties=props)
    return n / (time.perf_counter() - t), (time.thread_time() - cpu) / n


async def _floor(ch: aiormq.abc.AbstractChannel, n: int) -> tuple[float, float]:
    """The floor of an enqueue that keeps a record: the bare confirmed publish
    with, while it is confirmed, the record's write as the SQLite state store
    makes it (one upsert of ``RECORD`` bytes, a transaction by itself, on a
    WAL file at ``synchronous=NORMAL``, on the loop's thread; before h-rmqprod
    the store, and this floor, wrapped it in ``BEGIN IMMEDIATE`` / ``COMMIT``)."""
    import sqlite3

    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(FLOOR_DB + suffix)
    db = sqlite3.connect(FLOOR_DB, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL)")
    props = spec.Basic.Properties(delivery_mode=2)
    loop = asyncio.get_running_loop()
    cpu, t = time.thread_time(), time.perf_counter()
    for i in range(n):
        confirm = loop.create_task(
            ch.basic_publish(b"x" * 300, routing_key=FLOOR_QUEUE, properties=props)
        )
        await asyncio.sleep(0)  # the frames go out before the write holds the loop
        db.execute(
            "INSERT INTO kv (key, value, expires) VALUES (?,?,NULL) ON CONFLICT (key)"
            " DO UPDATE SET value=excluded.value WHERE kv.expires <= 0",
            (f"job:{i}", RECORD),
        )
        await confirm
    rate, per_call = n / (time.perf_counter() - t), (time.thread_time() - cpu) / n
    db.close()
    return rate, per_call


async def _pika(ex: Any, n: int) -> float:
    """The harness' loop (``peers/limits.py``): a new 100-byte persistent
    ``aio_pika.Message`` per publish to the default exchange."""
    t = time.perf_counter()
    for _ in range(n):
        msg = aio_pika.Message(b"x" * 100, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await ex.publish(msg, routing_key=PIKA_QUEUE)
    return n / (time.perf_counter() - t)


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


def noop_app(prefix: str, state: str) -> tuple[dw.App, Any]:
    """An App on RabbitMQ under ``prefix`` (its own delay cascade), records in
    the SQLite file ``state``, and its no-op task."""
    url = f"{AMQP}?prefix={prefix}&delays={prefix}.delay"
    app = dw.App(f"{url}&state={quote(f'sqlite:///{state}', safe='')}")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        pass

    return app, noop


async def delete_topology(ch: aiormq.abc.AbstractChannel, broker: Any) -> None:
    """Delete the queues and the delay cascade ``broker`` declared: the jobs
    enqueued (no worker runs them) would pile up run after run."""
    names = broker.names
    for q in [*names.lanes("default"), names.dlq("default")]:
        await ch.queue_delete(q)
    for lvl in range(topo.LEVELS):
        await ch.queue_delete(names.level_queue(lvl))
        await ch.exchange_delete(names.level(lvl))
    await ch.exchange_delete(names.level(-1))
    # the state store is new each run: forget the old one's identity
    await ch.queue_delete(announce.name(names.prefix))
    await ch.exchange_delete(announce.name(names.prefix))


async def main(n: int, reps: int, profile: str | None = None) -> None:
    app, noop = noop_app("dwenq", STATE)
    await noop.aenqueue(-1)  # connects, declares
    broker: Any = app.broker
    adds: list[float] = []
    sends: list[float] = []
    broker.state.kv_add = _timed(adds, broker.state.kv_add)
    broker._send = _timed(sends, broker._send)
    # the usual call sends through the link (``AmqpLink.start_one``) instead:
    # from its frames' start to its confirm
    starts: dict[int, float] = {}
    # (absent before b880959: the script also measures older commits)
    real_start: Any = getattr(AmqpLink, "start_one", None)
    real_confirm: Any = getattr(AmqpLink, "confirm_one", None)

    def start_one(self: AmqpLink, item: Any) -> Any:
        t = time.perf_counter()
        fut = real_start(self, item)
        if fut is not None:
            starts[id(fut)] = t
        return fut

    async def astart_one(self: AmqpLink, item: Any) -> Any:
        # since the publish hook lost its direct write: a coroutine
        t = time.perf_counter()
        started = await real_start(self, item)
        if started is not None:
            starts[id(started)] = t
        return started

    async def confirm_one(self: AmqpLink, fut: Any) -> None:
        try:
            await real_confirm(self, fut)
        finally:
            sends.append(time.perf_counter() - starts.pop(id(fut)))

    if real_start is not None and real_confirm is not None:
        patched = astart_one if inspect.iscoroutinefunction(real_start) else start_one
        setattr(AmqpLink, "start_one", patched)  # noqa: B010 (patched for the run)
        setattr(AmqpLink, "confirm_one", confirm_one)  # noqa: B010
    conn = await aiormq.connect(AMQP)
    pika = await aio_pika.connect(AMQP)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(BARE_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        await ch.queue_declare(FLOOR_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        pch = await pika.channel(publisher_confirms=True)
        await pch.declare_queue(PIKA_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        lane = broker.names.lane("default", topo.lane_of(0))  # where noop's jobs go

        async def empty(*queues: str) -> None:
            # every run starts on an empty queue: a quorum queue takes
            # publishes slower as it fills, so a client that ran after the
            # others' messages piled up would be measured on a deeper queue
            for q in queues:
                await ch.queue_purge(q)

        of_aiormq: list[float] = []
        of_pika: list[float] = []
        of_floor: list[float] = []
        floor_of_aiormq: list[float] = []
        for rep in range(1, reps + 1):
            await empty(PIKA_QUEUE)
            pika1 = await _pika(pch.default_exchange, n)
            await empty(BARE_QUEUE)
            bare, bare_cpu = await _bare(ch, n)
            await empty(FLOOR_QUEUE)
            floor, floor_cpu = await _floor(ch, n)
            await empty(lane)
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
                prof.dump_stats(str(profile))
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            rate, dw_cpu = n / (time.perf_counter() - t), (time.thread_time() - cpu) / n
            await empty(FLOOR_QUEUE)
            floor2, floor_cpu2 = await _floor(ch, n)
            await empty(BARE_QUEUE)
            bare2, bare_cpu2 = await _bare(ch, n)
            await empty(PIKA_QUEUE)
            pika2 = await _pika(pch.default_exchange, n)
            anchor = (bare + bare2) / 2
            pika_anchor = (pika1 + pika2) / 2
            floor_anchor = (floor + floor2) / 2
            of_floor.append(rate / floor_anchor)
            floor_of_aiormq.append(floor_anchor / anchor)
            of_aiormq.append(rate / anchor)
            of_pika.append(rate / pika_anchor)
            print(
                f"rep {rep}: bare aiormq {bare:,.0f}/{bare2:,.0f}/s, aio-pika "
                f"{pika1:,.0f}/{pika2:,.0f}/s, floor {floor:,.0f}/{floor2:,.0f}/s "
                f"({floor_anchor / anchor:.2f} of aiormq, loop CPU "
                f"{(floor_cpu + floor_cpu2) / 2 * 1e6:.0f} us), "
                f"aenqueue {rate:,.0f}/s ({rate / floor_anchor:.2f} of the floor, "
                f"{rate / anchor:.2f} of "
                f"aiormq, {rate / pika_anchor:.2f} of aio-pika); loop CPU per call "
                f"{dw_cpu * 1e6:.0f} us (bare {(bare_cpu + bare_cpu2) / 2 * 1e6:.0f}); "
                f"kv_add p50 {statistics.median(adds) * 1e6:.0f} us, "
                f"publish+confirm p50 {statistics.median(sends) * 1e6:.0f} us"
            )
        print(
            f"median of {reps}: {statistics.median(of_aiormq):.2f} of bare aiormq, "
            f"{statistics.median(of_floor):.2f} of the floor (the floor "
            f"{statistics.median(floor_of_aiormq):.2f} of bare aiormq), "
            f"{statistics.median(of_pika):.2f} of bare aio-pika"
        )
        await ch.queue_delete(BARE_QUEUE)
        await ch.queue_delete(FLOOR_QUEUE)
        await ch.queue_delete(PIKA_QUEUE)
        await delete_topology(ch, broker)
    finally:
        await pika.close()
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
