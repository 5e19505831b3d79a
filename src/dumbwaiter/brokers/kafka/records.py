"""Kafka's part of the job records kept in the state store (the record itself:
``brokers/record.py``, shared with RabbitMQ), and how each outcome changes one.

Kafka keeps an append-only log: it cannot say where job ``X`` is, move a
job between states, or tell a stale copy from the current one.  So every
job has a record in the state store (any dumbwaiter broker that every host
shares, through its key-value seam): the envelope, its state, a version that
grows with each copy of it written to Kafka, and the fencing token of its
current lease.  A copy whose version is not its record's (retried, rescued,
rescheduled, cancelled or replayed since) is stale and dropped.

Every function here is pure: it reads records and says what to write, so
it runs inside the store's atomic ``kv_update``.
"""

from __future__ import annotations

from ...errors import LeaseExpired
from ...message import ErrorRecord
from ...state import State
from ..record import Record, delivery_id

__all__ = ["SETTLED", "SETTLED_TTL", "WAITING", "Record", "delivery_id", "lease_error"]

#: states whose record waits for a copy to be taken
WAITING = frozenset({State.READY, State.SCHEDULED})
#: what a lease entry holds once its job was settled (kept a moment, then gone)
SETTLED = b"-"
SETTLED_TTL = 1.0


def lease_error(rec: Record, now: float) -> ErrorRecord:
    """The error a job whose lease ran out records for its lost attempt."""
    return ErrorRecord(
        time=now,
        type=f"dumbwaiter.errors.{LeaseExpired.__name__}",
        message=f"lease expired: worker {rec.worker or '?'} stopped heartbeating "
        f"during attempt {rec.msg.attempt}",
        worker=rec.worker or "",
        attempt=rec.msg.attempt,
    )
