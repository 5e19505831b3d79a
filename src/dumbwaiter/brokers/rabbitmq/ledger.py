"""The job index kept in the companion state store (its records:
``brokers/record.py``, shared with Kafka).

RabbitMQ holds messages, not a searchable index: it cannot say where job
``X`` is, list dead jobs by error type, or tell a stale copy from the current
one.  So every job has a record in the state store (any dumbwaiter broker,
through its key-value seam): the envelope, its state, a version that grows
with each copy of it sent to RabbitMQ, and the fencing token of its current
lease.  A copy that arrives with an older version than its record is stale
(retried, rescued, rescheduled or cancelled since) and is dropped.
"""

from __future__ import annotations

from ..record import Record, delivery_id

__all__ = ["Keys", "Record", "delivery_id"]


class Keys:
    """Key names in the state store, under this app's prefix (user keys of
    the kv seam pass through unprefixed and never start with ``_rmq``)."""

    def __init__(self, prefix: str) -> None:
        base = f"_rmq.{prefix}:"
        self.job = base + "job:"
        self.key = base + "key:"
        self.lease = base + "lease:"
        self.paused = base + "paused:"
        self.queue = base + "queue:"
        self.lane = base + "lane:"
        self.dlq = base + "dlq:"
        self.binding = base + "bind:"
        self.event = base + "event:"
        self.log = base + "log:"
        self.claim = base + "claim:"

    def log_prefix(self, event_type: str) -> str:
        return f"{self.log}{event_type}\x1f"
