"""The bare client's pickup latency on RabbitMQ: the floor under W3.

Issue #7 asks W3 (enqueue-to-start latency at 200 jobs/s, one worker
process) for p50 <= 1 ms on RabbitMQ, with quorum queues and publisher
confirms on by default.  A quorum queue hands a message to a consumer only
once it is in the Raft log, so no library on it can start a job sooner than
the bare client is delivered one.  This measures that floor with nothing of
dumbwaiter's: one process publishes (aiormq, persistent messages) at
``--rate`` messages/s, the time of each call's start in the body; a consumer
in a second process (as the harness' worker is) takes each delivery with
``no_ack`` off and acks it, and notes when it arrived.  Latency = arrival -
call start (``time.monotonic``, one clock for both processes on Linux).
It also notes when the delivery's bytes reached the consumer's socket (the
stream's ``feed_data``): that is what RabbitMQ itself takes, before any
client code runs, so no client in any language starts a job sooner; the
rest of the bare client's figure is aiormq's parsing and its task per
message.

Three cases: a quorum queue with confirms (dumbwaiter's default), a classic
queue with confirms (``queue_type=classic``), a classic queue without
confirms (what dramatiq does by default).

    .venv/bin/python benchmarks/rabbitmq_floor.py [-n 1000] [--rate 200] [--url AMQP_URL]
    .venv/bin/python benchmarks/rabbitmq_floor.py --json FILE   # the figures as JSON too

``benchmarks/run.sh`` runs it after the harness whenever a RabbitMQ library
ran, writing ``rabbitmq-floor.json`` beside ``results.json``, and
``benchmarks/ratios.py`` sets dumbwaiter's W3 against it: the floor of the
same run, not of another day.

Queues ``dw-floor-*`` are declared and deleted.  Run it under the
benchmarks' flock, like the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import struct
import time
from multiprocessing.connection import Connection

import aiormq
from pamqp import commands as spec

CASES = (("quorum", True), ("classic", True), ("classic", False))
_STAMP = struct.Struct("!d")


async def _consume(url: str, queue: str, n: int, out: Connection) -> None:
    # when the connection's stream was last fed bytes: the delivery's
    # arrival at this process's socket, before any client code parses it
    fed = [0.0]
    feed = asyncio.StreamReader.feed_data

    def stamped(self: asyncio.StreamReader, data: bytes) -> None:
        fed[0] = time.monotonic()
        feed(self, data)

    asyncio.StreamReader.feed_data = stamped  # type: ignore[method-assign, assignment]
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    await ch.basic_qos(prefetch_count=10)
    lat: list[float] = []
    wire: list[float] = []
    done = asyncio.get_running_loop().create_future()

    async def on(msg: aiormq.abc.DeliveredMessage) -> None:
        sent = _STAMP.unpack_from(msg.body)[0]
        lat.append(time.monotonic() - sent)
        wire.append(fed[0] - sent)
        assert msg.delivery_tag is not None
        await ch.basic_ack(msg.delivery_tag)
        if len(lat) == n and not done.done():
            done.set_result(None)

    await ch.basic_consume(queue, on)
    out.send("ready")
    await done
    out.send((lat, wire))
    await conn.close()


def _consumer(url: str, queue: str, n: int, out: Connection) -> None:
    asyncio.run(_consume(url, queue, n, out))


async def _produce(url: str, queue: str, n: int, rate: float, confirms: bool) -> None:
    conn = await aiormq.connect(url)
    ch = await conn.channel(publisher_confirms=confirms)
    props = spec.Basic.Properties(delivery_mode=2)
    pad = b"x" * 292  # about the size of a dumbwaiter envelope
    gap = 1.0 / rate
    nxt = time.monotonic()
    for _ in range(n):
        nxt += gap
        await ch.basic_publish(
            _STAMP.pack(time.monotonic()) + pad, routing_key=queue, properties=props
        )
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    await conn.close()


async def _declare(url: str, queue: str, kind: str, delete: bool) -> None:
    conn = await aiormq.connect(url)
    ch = await conn.channel()
    if delete:
        await ch.queue_delete(queue)
    else:
        await ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        await ch.queue_purge(queue)
    await conn.close()


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()
    rows: list[dict[str, object]] = []
    ctx = mp.get_context("spawn")
    print(
        "| queue | confirms | p50 ms | p95 ms | p99 ms | bytes at the socket, p50 ms |\n"
        "|---|---|--:|--:|--:|--:|"
    )
    for kind, confirms in CASES:
        queue = f"dw-floor-{kind}"
        asyncio.run(_declare(a.url, queue, kind, delete=False))
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_consumer, args=(a.url, queue, a.n, theirs))
        proc.start()
        try:
            assert mine.recv() == "ready"
            asyncio.run(_produce(a.url, queue, a.n, a.rate, confirms))
            lat, wire = mine.recv()
        finally:
            proc.join(30)
            asyncio.run(_declare(a.url, queue, kind, delete=True))
        row = {
            "queue": kind,
            "confirms": confirms,
            "p50_ms": round(statistics.median(lat) * 1000, 3),
            "p95_ms": round(_pct(lat, 0.95), 3),
            "p99_ms": round(_pct(lat, 0.99), 3),
            "socket_p50_ms": round(statistics.median(wire) * 1000, 3),
            "n": len(lat),
        }
        rows.append(row)
        print(
            f"| {kind} | {'yes' if confirms else 'no'} | {row['p50_ms']:.2f} "
            f"| {row['p95_ms']:.2f} | {row['p99_ms']:.2f} | {row['socket_p50_ms']:.2f} |"
        )
    if a.json:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        with open(a.json, "w") as f:
            json.dump({"at": at, "rate": a.rate, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
