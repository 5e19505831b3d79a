"""``amqp://USER:PASS@HOST:PORT/VHOST?state=URL&prefix=NAME`` (``amqps://`` for TLS).

RabbitMQ carries the jobs: quorum queues, publisher confirms (an enqueue
returns once RabbitMQ confirmed every message), manual acks after the
outcome is recorded, consumers whose prefetch follows the worker's drain
rate, a topic exchange that fans events out to group queues, a dead-letter
exchange into a DLQ per queue, and a plugin-free delay cascade
(topology.py) for ``eta`` and retries.  RabbitMQ has no key-value store,
no locks and no index of jobs, so a companion *state store* (any other
dumbwaiter broker, named by ``state=``) keeps them: coordination is
delegated to it as is (coordination.py), and every job has a record there
that the admin reads and that decides whether a copy RabbitMQ hands out is
current (ledger.py).  See docs/rabbitmq.md.

``RabbitMQBroker`` is its parts put together, each a mixin on the
connections they share (connection.py) and the records (ledger.py):

* enqueue.py: declare, enqueue, publish, list_events (producers);
* transport.py: fetch, the admission of what RabbitMQ hands out (workers);
* outcomes.py: ack, retry, requeue, dead, extend, rescue (workers);
* admin.py: stats, listings, replay, purge, cancel, reschedule, pause.
"""

from __future__ import annotations

from typing import ClassVar

from ..types import Capabilities
from .admin import RabbitMQAdmin
from .enqueue import RabbitMQEnqueue
from .outcomes import RabbitMQOutcomes
from .transport import RabbitMQTransport


class RabbitMQBroker(RabbitMQEnqueue, RabbitMQTransport, RabbitMQOutcomes, RabbitMQAdmin):
    """The RabbitMQ broker (see the module docstring for its parts)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=False,
        events=True,
        limits=True,
        multi_process=True,
        max_message_size=128 * 1024 * 1024,
    )
    schemes: ClassVar[tuple[str, ...]] = ("amqp", "amqps")

    def __repr__(self) -> str:
        return f"<RabbitMQBroker {self.names.prefix} state={self.state!r}>"
