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

from dumbwaiter_adapter import SCRATCH, AsyncDumbwaiterAdapter, DumbwaiterAdapter, _app
from peers.adapters.base import Adapter
from peers.common import AMQP_URL, amqp_delete_queues, amqp_queue_depth

from dumbwaiter.brokers.rabbitmq import announce, topology

PREFIX = "dwbench"
STATE_PATH = SCRATCH / "dumbwaiter-rabbitmq-state.db"


def _url(prefix: str, state: Path, **options: str) -> str:
    query = {"prefix": prefix, "delays": f"{prefix}.delay", **options}
    query["state"] = quote(f"sqlite:///{state}", safe="")
    return AMQP_URL + "?" + "&".join(f"{k}={v}" for k, v in query.items())


RABBITMQ_URL = _url(PREFIX, STATE_PATH)
# Creating an App opens no connection until first use.
rabbitmq_app, RABBITMQ_TASKS = _app(RABBITMQ_URL)

# The same on classic queues (queue_type=classic), to show what quorum
# queues' fsync-before-confirm costs next to peers that use classic queues.
CLASSIC_PREFIX = "dwbenchc"
CLASSIC_STATE_PATH = SCRATCH / "dumbwaiter-rabbitmq-classic-state.db"
CLASSIC_URL = _url(CLASSIC_PREFIX, CLASSIC_STATE_PATH, queue_type="classic")
rabbitmq_classic_app, _ = _app(CLASSIC_URL)


def _names(prefix: str) -> tuple[list[str], list[str]]:
    names = topology.Topology(prefix, f"{prefix}.delay")
    # reset() deletes the state store's file: a new store, so its
    # announcement goes too (the next worker would otherwise be refused as
    # a second store for the same prefix: StateStoreConflict)
    state = announce.name(prefix)
    queues = [
        state,
        *names.lanes("default"),
        names.dlq("default"),
        *(names.level_queue(n) for n in range(topology.LEVELS)),
    ]
    exchanges = [
        state,
        names.dlx,
        names.events,
        *(names.level(n) for n in range(-1, topology.LEVELS)),
    ]
    return queues, exchanges


class DumbwaiterRabbitMQAdapter(AsyncDumbwaiterAdapter):
    """Quorum queues, confirms, consumers; records in a SQLite state store."""

    dists = ("dumbwaiter", "orjson", "aio-pika", "aiormq")
    bulk_api = "await task.aenqueue_many(ids) (records in one transaction, confirms pipelined)"
    notes = (
        "RabbitMQ quorum queue (durable, persistent messages, publisher confirms awaited), "
        "consumer prefetch following the drain rate (at least twice the worker's concurrency), "
        "ack after the outcome is recorded; "
        "job records and leases in a companion SQLite state store (WAL) on local disk; async "
        "producer (aenqueue), no thread hop."
    )

    def __init__(
        self,
        name: str = "dumbwaiter-rabbitmq",
        prefix: str = PREFIX,
        state: Path = STATE_PATH,
        app_attr: str = "rabbitmq_app",
    ) -> None:
        url = RABBITMQ_URL if prefix == PREFIX else CLASSIC_URL
        super().__init__(name, "rabbitmq", url, app_attr)
        self.prefix = prefix
        self.state = state
        self.queues, self.exchanges = _names(prefix)

    async def open(self) -> None:  # type: ignore[override]
        DumbwaiterAdapter.open(self)  # a fresh App; it connects on the first enqueue

    def reset(self) -> None:
        amqp_delete_queues(*self.queues)
        _delete_exchanges(self.exchanges)
        self.state.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.state}{suffix}").unlink(missing_ok=True)

    def pending(self) -> int | None:
        return amqp_queue_depth(self.queues[1])  # the main lane


class DumbwaiterRabbitMQClassicAdapter(DumbwaiterRabbitMQAdapter):
    """The same broker with ``queue_type=classic`` (not the default)."""

    notes = (
        "As dumbwaiter-rabbitmq but queue_type=classic: classic durable queues (single node, "
        "not replicated), persistent messages, confirms awaited; for comparison only."
    )

    def __init__(self) -> None:
        super().__init__(
            "dumbwaiter-rabbitmq-classic",
            CLASSIC_PREFIX,
            CLASSIC_STATE_PATH,
            "rabbitmq_classic_app",
        )


def _delete_exchanges(names: list[str]) -> None:
    from peers.common import amqp_connection

    conn = amqp_connection()
    try:
        ch = conn.channel()
        for name in names:
            ch.exchange_delete(exchange=name)
    finally:
        conn.close()


ADAPTERS: list[Adapter] = [DumbwaiterRabbitMQAdapter(), DumbwaiterRabbitMQClassicAdapter()]
