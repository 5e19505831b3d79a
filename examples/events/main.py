"""Events: one fact, every subscriber group, versions upgraded, replay from the log.

python examples/events/main.py
DUMBWAITER_URL=redis://127.0.0.1:6379/0?prefix=example python examples/events/main.py
"""

import asyncio
import os
import tempfile

import dumbwaiter as dw
from dumbwaiter.event import replay
from dumbwaiter.testing import drain

app = dw.App(os.environ.get("DUMBWAITER_URL") or f"sqlite:///{tempfile.mkdtemp()}/events.db")


class OrderCreatedV1(dw.Event, type="order.created", version=1):
    order_id: str
    total: float  # dollars


class OrderCreated(dw.Event, type="order.created", version=2):
    order_id: str
    total_cents: int


@app.upcast("order.created", from_version=1)
def to_cents(payload: dict) -> dict:
    return {"order_id": payload["order_id"], "total_cents": round(payload["total"] * 100)}


@app.subscribe(OrderCreated, group="email")
def send_receipt(event: OrderCreated, ctx: dw.Context) -> None:
    print(f"  email:   receipt for {event.order_id} ({event.total_cents} cents)")


@app.subscribe(OrderCreated, group="billing")
async def bill(event: OrderCreated) -> None:
    print(f"  billing: invoice {event.order_id}")


async def main() -> None:
    await app.apublish(OrderCreated(order_id="o-1", total_cents=1200), key="o-1")
    await app.apublish(OrderCreatedV1(order_id="o-0", total=9.5))  # an old producer
    await drain(app)

    @app.subscribe(OrderCreated, group="analytics")  # a consumer added later
    def count(event: OrderCreated) -> None:
        print(f"  analytics (replayed): {event.order_id}")

    print("replaying the log to the new group:")
    await replay(app, "order.created", "analytics")
    await drain(app)


if __name__ == "__main__":
    asyncio.run(main())
