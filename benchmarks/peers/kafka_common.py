"""What the Kafka adapters of the peers harness share (not an adapter module:
no ``_adapter`` suffix, so the harness' registry does not import it).

The harness knows no Kafka server (``peers/servers.py`` checks Redis,
Postgres, RabbitMQ and NATS), so ``benchmarks/kafka_run.sh`` starts tansu
and names it in ``DW_BENCH_KAFKA``; without it the Kafka adapters list
nothing (``ADAPTERS = []``), so the other runs of the harness, which import
every adapter module of this folder, never need aiokafka or a Kafka server.

Every run of one (library, workload) gets topics of its own: ``reset``
(called by the runner before and after each run, before the worker starts)
draws a new run id into the runner's environment, which the worker process
inherits, and ``open`` reads it, so the producer and the worker agree on
the names without a shared file, and no run reads another's backlog (tansu
keeps everything in memory; old topics cost it a little memory only).
"""

from __future__ import annotations

import os
import secrets

#: the cluster (``host:port``) of the run; empty outside the Kafka run
KAFKA = os.environ.get("DW_BENCH_KAFKA", "")
RUN_ENV = "DW_BENCH_KAFKA_RUN"
#: fetch.max.wait.ms of every consumer we configure (dumbwaiter's default
#: ``fetch_wait=0.1``): tansu answers a waiting fetch only after it, so W3's
#: pickup latency is compared at the same wait
FETCH_WAIT_MS = 100
#: partitions of the topics we make (dumbwaiter's default ``partitions=3``)
PARTITIONS = 3

#: the claim floor's checked write (``aiokafka_claim_floor_adapter``, and
#: ``benchmarks/kafka_w3_steps.py``'s ``floor``): for each pair of KEYS (the
#: record, the lease), lease it if the record is there and no lease is; 1
#: where it was leased, 0 where not
CLAIM = """
local out = {}
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1
      and redis.call('SET', KEYS[i + 1], ARGV[1], 'NX', 'PX', 15000) then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""


def run_id() -> str:
    """This run's id (the worker inherits it from the runner)."""
    return os.environ.get(RUN_ENV, "0")


def new_run() -> None:
    """A new run id for what follows (called from the adapters' ``reset``)."""
    os.environ[RUN_ENV] = secrets.token_hex(4)


async def ensure_topic(topic: str, partitions: int = PARTITIONS) -> None:
    """Make ``topic`` unless it exists (the producer and the worker both
    call it: in W3 the worker starts first)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=KAFKA)
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            try:
                await admin.create_topics([NewTopic(topic, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()
