"""dumbwaiter on its RabbitMQ broker in the peers harness, next to the
RabbitMQ peers on the same server (the harness' ``AMQP_URL``, vhost ``/``).

Everything it declares is named ``dwbench.*`` (its queues, exchanges and its
own delay cascade, ``delays=dwbench.delay``), so ``reset`` deletes exactly
those; the companion state store (job records, coordination) is a SQLite file
in the harness' scratch folder, deleted by ``reset`` too.

The producer side is async (``aenqueue``/``aenqueue_many`` on the harness'
loop): the broker has no sync enqueue path (``docs/rabbitmq.md`` says why),
so a sync caller would pay one thread hop per call through the App's portal;
the async path is what an ASGI app uses and what the bare aio-pika anchor and
taskiq-aio-pika measure.

Worker side: ``dumbwaiter worker --app dumbwaiter_rabbitmq_adapter:rabbitmq_app``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from dumbwaiter_adapter import SCRATCH, DumbwaiterAdapter, _app
from peers.adapters.base import Adapter
from peers.common import AMQP_URL, amqp_delete_queues, amqp_queue_depth

from dumbwaiter.brokers.rabbitmq import topology

PREFIX = "dwbench"
DELAYS = f"{PREFIX}.delay"
STATE_PATH = SCRATCH / "dumbwaiter-rabbitmq-state.db"
RABBITMQ_URL = (
    f"{AMQP_URL}?prefix={PREFIX}&delays={DELAYS}&state={quote(f'sqlite:///{STATE_PATH}', safe='')}"
)

# Creating an App opens no connection until first use.
rabbitmq_app, RABBITMQ_TASKS = _app(RABBITMQ_URL)

NAMES = topology.Names(PREFIX, DELAYS)
QUEUES = [
    *NAMES.lanes("default"),
    NAMES.dlq("default"),
    *(NAMES.level_queue(n) for n in range(topology.LEVELS)),
]
EXCHANGES = [NAMES.dlx, NAMES.events, *(NAMES.level(n) for n in range(-1, topology.LEVELS))]


class DumbwaiterRabbitMQAdapter(DumbwaiterAdapter):
    """Quorum queues, confirms, consumers; records in a SQLite state store."""

    dists = ("dumbwaiter", "orjson", "aio-pika", "aiormq")
    is_async = True
    bulk_api = "await task.aenqueue_many(ids) (records in one transaction, confirms pipelined)"
    notes = (
        "RabbitMQ quorum queue (durable, persistent messages, publisher confirms awaited), "
        "consumer prefetch = the worker's concurrency, ack after the outcome is recorded; "
        "job records and leases in a companion SQLite state store (WAL) on local disk; async "
        "producer (aenqueue), no thread hop."
    )

    def __init__(self) -> None:
        super().__init__("dumbwaiter-rabbitmq", "rabbitmq", RABBITMQ_URL, "rabbitmq_app")

    async def open(self) -> None:  # type: ignore[override]
        super().open()

    async def close(self) -> None:  # type: ignore[override]
        if self._app is not None:
            await self._app.aclose()
            self._app, self._tasks = None, {}

    async def enqueue_one(self, task: str, i: int) -> None:  # type: ignore[override]
        await self._tasks[task].aenqueue(i)

    async def enqueue_bulk(self, task: str, ids: range) -> None:  # type: ignore[override]
        await self._tasks[task].aenqueue_many(ids)

    def worker_cmd(self, concurrency: int) -> list[str]:
        # the base class names its own module in --app; the App is defined here
        cmd = super().worker_cmd(concurrency)
        cmd[cmd.index("--app") + 1] = f"{__name__}:{self.app_attr}"
        return cmd

    def reset(self) -> None:
        amqp_delete_queues(*QUEUES)
        _delete_exchanges(EXCHANGES)
        STATE_PATH.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{STATE_PATH}{suffix}").unlink(missing_ok=True)

    def pending(self) -> int | None:
        return amqp_queue_depth(NAMES.lane("default"))


def _delete_exchanges(names: list[str]) -> None:
    from peers.common import amqp_connection

    conn = amqp_connection()
    try:
        ch = conn.channel()
        for name in names:
            ch.exchange_delete(exchange=name)
    finally:
        conn.close()


ADAPTERS: list[Adapter] = [DumbwaiterRabbitMQAdapter()]
