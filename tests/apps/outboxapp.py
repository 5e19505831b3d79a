"""The app of the outbox process tests: ``tests.apps.outboxapp:app``.

Its event handler writes its effect and the inbox mark in one transaction of
the shop database, so duplicates (a relay re-sending after SIGKILL) leave no
trace.
"""

from __future__ import annotations

import os
import sqlite3

import dumbwaiter as dw

app = dw.App(os.environ.get("OUTBOXAPP_URL", "memory://"))


class OrderPaid(dw.Event, type="outboxtest.order_paid"):
    n: int


@app.subscribe(OrderPaid, group="ledger")
def ledger(event: OrderPaid, ctx: dw.Context) -> None:
    conn = sqlite3.connect(os.environ["OUTBOXAPP_SHOP"], timeout=30)
    try:
        with conn:
            if ctx.inbox(conn):
                conn.execute("INSERT INTO ledger (n) VALUES (?)", (event.n,))
    finally:
        conn.close()
