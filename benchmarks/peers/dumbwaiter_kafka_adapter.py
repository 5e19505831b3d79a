"""dumbwaiter on its Kafka broker in the peers harness, next to the bare
aiokafka client (``aiokafka_bare_adapter``) and taskiq-aio-kafka on the same
tansu server (``benchmarks/kafka_run.sh`` starts it and names it in
``DW_BENCH_KAFKA``; without it this module lists no adapter).

The state store is the harness' Redis database (db 1, flushed by ``reset``
as for the Redis peers); topics and groups are under a prefix of the run's
own (``kafka_common``).  URL defaults otherwise: 3 partitions per queue
topic, ``fetch_wait=0.1`` (tansu answers a waiting fetch only after it),
``session_timeout=10``.  The producer is async, as the anchor's.

Worker side: ``dumbwaiter worker --app dumbwaiter_kafka_adapter:kafka_app``.
"""

from __future__ import annotations

from urllib.parse import quote

from dumbwaiter_adapter import AsyncDumbwaiterAdapter, _app
from kafka_common import KAFKA, new_run, run_id
from peers.adapters.base import Adapter
from peers.common import REDIS_URL, redis_flush


def kafka_url() -> str:
    """The run's URL: its own prefix, its records in Redis db 1."""
    prefix = f"b{run_id()}"
    state = quote(f"{REDIS_URL}?prefix={prefix}", safe="")
    return f"kafka://{KAFKA}?prefix={prefix}&state={state}"


# Creating an App opens no connection until first use (the worker's, with
# the run id the runner put in its environment).
if KAFKA:
    kafka_app, KAFKA_TASKS = _app(kafka_url())


class DumbwaiterKafkaAdapter(AsyncDumbwaiterAdapter):
    """Copies on Kafka, judged against records in a Redis state store."""

    dists = ("dumbwaiter", "orjson", "aiokafka", "redis", "hiredis")
    bulk_api = (
        "await task.aenqueue_many(ids) (records 1,000 at a time, one update each, while the "
        "chunk's copies are sent in record batches)"
    )
    notes = (
        "Kafka (tansu 0.6, in memory) with a Redis state store (db 1): each enqueue writes the "
        "job's record (one script call) while its copy is sent (acks=all); the worker judges the "
        "copies it read against their records (one update per fetch), settles each outcome in "
        "the records and commits the low-water mark; topics of 3 partitions, fetch_wait 0.1 s."
    )

    def __init__(self) -> None:
        super().__init__("dumbwaiter-kafka", "kafka", "", "kafka_app")

    def reset(self) -> None:
        new_run()
        self.url = kafka_url()
        redis_flush()


ADAPTERS: list[Adapter] = [DumbwaiterKafkaAdapter()] if KAFKA else []
