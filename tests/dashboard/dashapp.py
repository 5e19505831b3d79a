"""The app the dashboard tests (and the browser tests' worker) use.

``$DASHAPP_URL`` names the broker; ``$DASHAPP_FLAG`` a file whose presence
lets ``flaky`` succeed, so a test can fix the "outage" and replay its dead
letters from the page.
"""

from __future__ import annotations

import os
from datetime import timedelta

import dumbwaiter as dw


class OrderPaid(dw.Event, type="dashboard.order_paid"):
    order: str


def create_app() -> dw.App:
    app = dw.App(
        os.environ.get("DASHAPP_URL", "memory://dashapp"),
        retry=dw.Retry(attempts=2, backoff=0.01, jitter=0),
    )

    @app.task(queue="mail", name="dashapp.flaky")
    def flaky(to: str) -> str:
        flag = os.environ.get("DASHAPP_FLAG", "")
        if not flag or not os.path.exists(flag):
            raise ConnectionError(f"smtp down for {to}")
        return f"sent to {to}"

    @app.task(queue="mail", name="dashapp.welcome")
    def welcome(user: int) -> None: ...

    @app.task(queue="reports", name="dashapp.report")
    def report(kind: str) -> None: ...

    @app.subscribe(OrderPaid, group="ledger")
    def book(event: OrderPaid) -> None: ...

    app.periodic(every=timedelta(minutes=5), name="dashapp.nightly", args=("daily",))(report)
    return app
