"""``sqlite:///PATH``: the embedded default broker.

One database file in WAL mode serves any number of producer and worker
processes on one machine.  ``SQLiteBroker`` is its parts put together, each
a mixin on the connections they share (connection.py):

* enqueue.py: enqueue, publish, the outbox's fast path (producers);
* transport.py: fetch, ack, retry, dead, requeue, extend, rescue (workers);
* admin.py: stats, listings, replay, purge, cancel, reschedule, pause;
* coordination.py: locks, the key-value store, rate limits and slots.

The tables are in schema.sql (schema.py applies it); wake.py wakes idle
fetches when another process commits.  See docs/sqlite.md.
"""

from __future__ import annotations

import sqlite3
from typing import ClassVar

from ..types import Capabilities
from .admin import SQLiteAdmin
from .coordination import SQLiteCoordination
from .enqueue import SQLiteEnqueue
from .schema import SCHEMA_VERSION
from .transport import SQLiteTransport


class SQLiteBroker(SQLiteEnqueue, SQLiteTransport, SQLiteAdmin, SQLiteCoordination):
    """The SQLite broker (see the module docstring for its parts)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True,
        transactional_outbox=True,
        multi_process=True,
        events=True,
        limits=True,
        native_capacity=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("sqlite",)
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)


__all__ = ["SCHEMA_VERSION", "SQLiteBroker"]
