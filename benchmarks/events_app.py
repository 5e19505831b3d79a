"""The app of benchmarks/events_sqlite.py: one event type, three subscriber groups.

Each handler appends one line to a plain file (one write(2)), as the peers
harness's task bodies do, so observing completion costs the broker nothing.
"""

from __future__ import annotations

import os
import time

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_EVENTS_URL", "sqlite:////tmp/dumbwaiter-bench/events.db"))
_fd: int | None = None


class OrderCreated(dw.Event, type="bench.order_created"):
    n: int


def _record(group: str, n: int) -> None:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["DW_EVENTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{group} {n} {time.monotonic():.6f}\n".encode())


@app.subscribe(OrderCreated, group="email")
async def email(event: OrderCreated) -> None:
    _record("email", event.n)


@app.subscribe(OrderCreated, group="billing")
async def billing(event: OrderCreated) -> None:
    _record("billing", event.n)


@app.subscribe(OrderCreated, group="analytics")
async def analytics(event: OrderCreated) -> None:
    _record("analytics", event.n)
