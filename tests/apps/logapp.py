"""The app of the worker-log process test: ``tests.apps.logapp:app``."""

from __future__ import annotations

import os

import dumbwaiter as dw

app = dw.App(os.environ.get("LOGAPP_URL", "memory://"))


@app.task(queue="mail")
def send_welcome(user_id: int) -> None: ...


@app.task(retry=dw.Retry(attempts=2, backoff=0.01, jitter=0))
def charge(order: str) -> None:
    raise ConnectionError(f"payment provider down for {order}")
