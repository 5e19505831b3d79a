"""The app the dashboard tests (and the browser tests' worker) use.

``$DASHAPP_URL`` names the broker; ``$DASHAPP_FLAG`` a file whose presence
lets ``flaky`` succeed, so a test can fix the "outage" and replay its dead
letters from the page; ``crunch`` appends its job id to ``$DASHAPP_STARTED``
when it starts, and runs until it is cancelled.
"""

from __future__ import annotations

import os
import time
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

    @app.task(queue="invites", name="dashapp.invite")
    def invite(email: str, team: str = "core", *, admin: bool = False) -> None: ...

    @app.task(
        queue="crm", name="dashapp.sync_crm", retry=dw.Retry(attempts=3, backoff=3600, jitter=0)
    )
    def sync_crm(account: int) -> None:
        raise TimeoutError(f"crm did not answer for {account}")

    @app.task(queue="slow", name="dashapp.crunch")
    def crunch(rows: int, ctx: dw.Context) -> int:
        """Works through ``rows`` until asked to stop (a test cancels it from
        another process)."""
        marker = os.environ.get("DASHAPP_STARTED", "")
        if marker:
            with open(marker, "a") as f:
                f.write(ctx.job_id + "\n")
        for _ in range(rows):  # 10 ms a row
            ctx.raise_if_cancelled()
            time.sleep(0.01)
        return rows

    @app.subscribe(OrderPaid, group="ledger")
    def book(event: OrderPaid) -> None:
        if event.order == "bad":
            raise ValueError("no such order: bad")

    app.periodic(every=timedelta(minutes=5), name="dashapp.nightly", args=("daily",))(report)
    return app
