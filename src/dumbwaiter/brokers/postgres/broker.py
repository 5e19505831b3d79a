"""``postgresql://`` (or ``postgres://``): the PostgreSQL broker.

``PostgresBroker`` is its parts put together, each a mixin on the
connections they share (connection.py):

* enqueue.py: enqueue, publish, the outbox's fast path (producers);
* transport.py: fetch, ack, retry, dead, requeue, extend, rescue (workers);
* admin.py: stats, listings, replay, purge, cancel, reschedule, pause;
* coordination.py: locks, the key-value store, rate limits and slots.

A part calls another only through the seam's own methods (a withdrawn
fetch's ``requeue``, maintenance's ``acquire``).  Every statement is in
queries.py; the schema's migrations in migrations.py and sql/.  See
docs/postgres.md.
"""

from __future__ import annotations

from typing import ClassVar

from ..types import Capabilities
from .admin import PostgresAdmin
from .capacity import PostgresCapacity
from .coordination import PostgresCoordination
from .enqueue import COPY_MIN, NOTIFY_MAX, PostgresEnqueue
from .transport import MAINTENANCE_LOCK, PostgresTransport


class PostgresBroker(
    PostgresCapacity, PostgresEnqueue, PostgresTransport, PostgresAdmin, PostgresCoordination
):
    """The PostgreSQL broker (see the module docstring for its parts)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True,
        transactional_outbox=True,
        multi_process=True,
        multi_host=True,
        events=True,
        limits=True,
        native_capacity=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")


__all__ = ["COPY_MIN", "MAINTENANCE_LOCK", "NOTIFY_MAX", "PostgresBroker"]
