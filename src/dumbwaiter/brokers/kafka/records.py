"""Kafka's part of the job records kept in the state store (the record itself:
``brokers/record.py``, shared with RabbitMQ; its state changes:
``brokers/transitions.py``).

Kafka keeps an append-only log: it cannot say where job ``X`` is, move a
job between states, or tell a stale copy from the current one.  So every
job has a record in the state store (any dumbwaiter broker that every host
shares, through its key-value seam): the envelope, its state, a version that
grows with each copy of it written to Kafka, and the fencing token of its
current lease.  A copy whose version is not its record's (retried, rescued,
rescheduled, cancelled or replayed since) is stale and dropped.
"""

from __future__ import annotations

from ..record import Record, delivery_id
from ..transitions import WAITING

__all__ = ["SETTLED", "SETTLED_TTL", "WAITING", "Record", "delivery_id"]

#: what a lease entry holds once its job was settled (kept a moment, then gone)
SETTLED = b"-"
SETTLED_TTL = 1.0
