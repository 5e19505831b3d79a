"""The floor of a Kafka worker that may start a job only after its record
says so, in the peers harness (``benchmarks/kafka_run.sh``): what W3's
pickup and W1's drain cannot go under while every job has a record in a
state store, next to the bare client (``aiokafka_bare_adapter``).

* producer: ``aiokafka-redis-floor``'s (``SET NX`` of a 480-byte record,
  then ``send_and_wait``; bulk: the records in one pipelined round trip,
  then the pipelined sends);
* worker: the anchor's ``getmany`` loop, plus one checked state-store write
  per batch before any task of it starts: one Lua call that, for each
  record read, checks that its job's record is there and that no lease is,
  and leases it; a job whose check fails (a cancelled or duplicated one) is
  not started.  Then the bodies, then the offsets' commit, as the anchor.

It leases and never settles: a job's end writes nothing (dumbwaiter's
settle runs beside the next fetch, not before a start), so this is a floor
of the pickup, not of a whole job's cost.  The worker process runs
``python -m aiokafka_claim_floor_adapter``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka_bare_adapter import BODIES, RedisFloorAdapter, topic
from kafka_common import CLAIM, FETCH_WAIT_MS, KAFKA, ensure_topic
from peers.adapters.base import Adapter
from peers.common import REDIS_URL


class ClaimFloorAdapter(RedisFloorAdapter):
    """The record-first producer and a worker that leases before it starts."""

    name = "aiokafka-claim-floor"
    notes = (
        "the floor of a worker that starts a job only after its record says so: "
        "aiokafka-redis-floor's producer; worker: the anchor's getmany loop plus one Lua call "
        "per batch (each record there and unleased -> leased) before any body starts"
    )

    def worker_cmd(self, concurrency: int) -> list[str]:
        return [self.py(), "-m", "aiokafka_claim_floor_adapter"]


async def work() -> None:
    """Read, lease each batch in one call, run what was leased, commit."""
    import redis.asyncio as aioredis
    from aiokafka import AIOKafkaConsumer

    name = topic()
    await ensure_topic(name)
    r = aioredis.Redis.from_url(REDIS_URL)
    claim = r.register_script(CLAIM)
    c = AIOKafkaConsumer(
        name,
        bootstrap_servers=KAFKA,
        group_id=name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    await c.start()
    try:
        while True:
            batch = await c.getmany(timeout_ms=1000, max_records=500)
            recs: list[Any] = [rec for rs in batch.values() for rec in rs]
            if not recs:
                continue
            jobs = [rec.value.decode().split() for rec in recs]
            keys = [k for _, i in jobs for k in (f"floor:{i}", f"floor-lease:{i}")]
            taken = await claim(keys=keys, args=["w"])
            for (task, i), ok in zip(jobs, taken, strict=True):
                if ok:
                    await BODIES[task](int(i))
            await c.commit()
    finally:
        await c.stop()
        await r.aclose()


ADAPTERS: list[Adapter] = [ClaimFloorAdapter()] if KAFKA else []

if __name__ == "__main__":
    asyncio.run(work())
