"""The bare client's confirmed publish on classic and quorum queues.

The peers harness' RabbitMQ anchor (``classic_confirm_1by1_per_s``) publishes
to a *classic* queue.  dumbwaiter's jobs go to quorum queues, whose confirm
waits for the Raft log's fsync, so the fair anchor for "one-at-a-time enqueue
>= 90 % of the bare confirmed publish" is the same client on a quorum queue.
This prints both, with aiormq (aio-pika's AMQP layer, what the broker uses):
one at a time (await each confirm) and pipelined (``IN_FLIGHT`` at once).

    .venv/bin/python benchmarks/rabbitmq_bare.py [AMQP_URL]   # default: guest@127.0.0.1, vhost /

It declares ``dw-bare-classic`` and ``dw-bare-quorum`` and deletes them at
the end.  Run it under the benchmarks' flock, like the harness.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiormq
from pamqp import commands as spec

N_ONE = 2000
N_PIPE = 10_000
IN_FLIGHT = 1000
BODY = b"x" * 300  # about the size of a dumbwaiter envelope
REPS = 3


async def _one_by_one(ch: aiormq.abc.AbstractChannel, queue: str) -> float:
    props = spec.Basic.Properties(delivery_mode=2)
    t = time.perf_counter()
    for _ in range(N_ONE):
        await ch.basic_publish(BODY, routing_key=queue, properties=props)
    return N_ONE / (time.perf_counter() - t)


async def _pipelined(ch: aiormq.abc.AbstractChannel, queue: str) -> float:
    props = spec.Basic.Properties(delivery_mode=2)
    t = time.perf_counter()
    for start in range(0, N_PIPE, IN_FLIGHT):
        await asyncio.gather(
            *(
                ch.basic_publish(BODY, routing_key=queue, properties=props, wait=False)
                for _ in range(min(IN_FLIGHT, N_PIPE - start))
            )
        )
    return N_PIPE / (time.perf_counter() - t)


async def main(url: str) -> None:
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        for kind in ("classic", "quorum"):
            queue = f"dw-bare-{kind}"
            await ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
            try:
                ones = [await _one_by_one(ch, queue) for _ in range(REPS)]
                pipes = [await _pipelined(ch, queue) for _ in range(REPS)]
                await ch.queue_purge(queue)
            finally:
                await ch.queue_delete(queue, if_unused=False, if_empty=False)
            print(
                f"{kind:8s} confirmed publish: one at a time {statistics.median(ones):8,.0f}/s "
                f"({min(ones):,.0f}-{max(ones):,.0f}); {IN_FLIGHT} in flight "
                f"{statistics.median(pipes):8,.0f}/s ({min(pipes):,.0f}-{max(pipes):,.0f})"
            )
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "amqp://guest:guest@127.0.0.1:5672/"))
