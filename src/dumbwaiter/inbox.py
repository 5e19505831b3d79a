"""The consumer inbox: an effect and its "seen" mark in one transaction.

    @app.subscribe(OrderCreated, group="billing")
    def bill(event, ctx):
        with db.begin() as conn:
            if ctx.inbox(conn):           # False: this event was handled before
                conn.execute(...)         # the effect and the mark commit together

The worker already drops redelivered events a group handled (the broker-side
inbox), but a handler that did its effect and died before the worker
recorded it runs again.  ``ctx.inbox(conn)`` closes that gap for effects in
the handler's own database: ``INSERT ... ON CONFLICT DO NOTHING`` of
(consumer, message id) into ``dw_inbox`` in the caller's transaction.  If the
transaction rolls back, so does the mark; if it commits, the effect happened
exactly once.
"""

from __future__ import annotations

import time

from .sqldb import Sql, ensure_table, ensure_table_sync

INBOX_DDL = {
    "sqlite": "CREATE TABLE IF NOT EXISTS dw_inbox (consumer TEXT NOT NULL,"
    " message_id TEXT NOT NULL, seen_at REAL NOT NULL, PRIMARY KEY (consumer, message_id))",
    "postgresql": "CREATE TABLE IF NOT EXISTS dw_inbox (consumer TEXT NOT NULL,"
    " message_id TEXT NOT NULL, seen_at DOUBLE PRECISION NOT NULL,"
    " PRIMARY KEY (consumer, message_id))",
}
_MARK = (
    "INSERT INTO dw_inbox (consumer, message_id, seen_at) VALUES (:consumer, :id, :at)"
    " ON CONFLICT (consumer, message_id) DO NOTHING"
)
_PRUNE = "DELETE FROM dw_inbox WHERE seen_at < :before"


def mark_sync(sql: Sql, consumer: str, message_id: str) -> bool:
    """Record (consumer, message id); True the first time, False after."""
    ensure_table_sync(sql, "dw_inbox", [INBOX_DDL[sql.dialect]])
    return sql.execute_sync(_MARK, {"consumer": consumer, "id": message_id, "at": time.time()}) == 1


async def mark(sql: Sql, consumer: str, message_id: str) -> bool:
    await ensure_table(sql, "dw_inbox", [INBOX_DDL[sql.dialect]])
    params = {"consumer": consumer, "id": message_id, "at": time.time()}
    return await sql.execute(_MARK, params) == 1


def prune_sync(sql: Sql, older_than: float) -> int:
    """Forget marks older than ``older_than`` seconds (keep them longer than
    any redelivery or replay can come: the event retention, 7 days)."""
    ensure_table_sync(sql, "dw_inbox", [INBOX_DDL[sql.dialect]])
    return sql.execute_sync(_PRUNE, {"before": time.time() - older_than})
