"""taskiq with taskiq-aio-kafka (``AioKafkaBroker``): the Python peer on
Kafka in ``benchmarks/kafka_run.sh`` (installed from
``benchmarks/peers/requirements-kafka.txt``).  This module lists no adapter
outside that run (no ``DW_BENCH_KAFKA``).

Broker defaults but two consumer settings a work queue needs: a consumer
group (``group_id``; the default ``None`` reads without a group and commits
nothing) and ``auto_offset_reset="earliest"`` (the default ``latest`` skips
what was enqueued before the worker started, i.e. all of W1).  So: one topic
of 1 partition (the default declaration), ``kiq()`` = ``send_and_wait`` with
acks=1 (its default), the worker reads with ``async for`` and auto-commits
every 5 s (at-most-once on a crash between a commit and the job's end; no
acks of its own), ``fetch_max_wait_ms=500`` (its default: on tansu, which
answers a waiting fetch only after it, this sets its W3 pickup).

Worker side: ``taskiq worker taskiq_aio_kafka_adapter:broker``.
"""

from __future__ import annotations

from typing import Any

from kafka_common import KAFKA, new_run, run_id
from peers import tasks
from peers.adapters.base import Adapter


def _broker() -> tuple[Any, dict[str, Any]]:
    """A broker on the run's topic, with the harness' two tasks (each open
    makes its own: the run's topic is drawn by ``reset``)."""
    from taskiq_aio_kafka import AioKafkaBroker

    b = AioKafkaBroker(bootstrap_servers=KAFKA, kafka_topic=f"taskiq-{run_id()}")
    b.configure_consumer(group_id="taskiq", auto_offset_reset="earliest")

    @b.task(task_name="noop")
    async def noop(i: int) -> None:
        await tasks.anoop(i)

    @b.task(task_name="sleep10ms")
    async def sleep10ms(i: int) -> None:
        await tasks.asleep10ms(i)

    return b, {"noop": noop, "sleep10ms": sleep10ms}


class TaskiqAioKafkaAdapter(Adapter):
    name = "taskiq-aio-kafka"
    dists = ("taskiq", "taskiq-aio-kafka", "aiokafka", "kafka-python")
    backend = "kafka"
    is_async = True
    default_concurrency = 100  # taskiq's default --max-async-tasks
    bulk = "none"
    notes = (
        "AioKafkaBroker defaults (1 partition, acks=1, auto-commit every 5 s, fetch_max_wait_ms "
        "500) but group_id='taskiq' and auto_offset_reset='earliest' (a work queue needs both)"
    )

    def __init__(self) -> None:
        self._broker: Any = None
        self._tasks: dict[str, Any] = {}

    async def open(self) -> None:  # type: ignore[override]
        self._broker, self._tasks = _broker()
        await self._broker.startup()  # makes the topic

    async def close(self) -> None:  # type: ignore[override]
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None

    async def enqueue_one(self, task: str, i: int) -> None:  # type: ignore[override]
        await self._tasks[task].kiq(i)

    def reset(self) -> None:
        new_run()

    def worker_cmd(self, concurrency: int) -> list[str]:
        return [self.exe("taskiq"), "worker", f"{__name__}:broker",
                "--workers", "1", "--max-async-tasks", str(concurrency),
                "--log-level", "WARNING"]  # fmt: skip


# the worker's (its run's topic is in the environment the runner gave it)
broker, TASKS = _broker() if KAFKA else (None, {})

ADAPTERS: list[Adapter] = [TaskiqAioKafkaAdapter()] if KAFKA else []
