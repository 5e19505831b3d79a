"""FastAPI: an order endpoint that enqueues and publishes, with the dashboard mounted.

    uvicorn main:api                 # serve it (POST /orders, dashboard at /ops/jobs/)
    dumbwaiter worker --app main:app # run its jobs
    python main.py                   # or: one request, a worker in-process, the results

`python main.py` uses a throwaway SQLite file, drives the API with Starlette's
TestClient (which runs the lifespan) and runs the jobs with dw.testing.drain.
"""

from __future__ import annotations

import os
import tempfile

from fastapi import FastAPI
from pydantic import BaseModel

import dumbwaiter as dw
from dumbwaiter.contrib.fastapi import lifespan, mount_dashboard

app = dw.App(os.environ.get("DUMBWAITER_URL") or f"sqlite:///{tempfile.mkdtemp()}/shop.db")
ORDERS: dict[str, int] = {}  # stands in for your database


class Order(BaseModel):
    id: str
    email: str
    total_cents: int


class OrderCreated(dw.Event, type="order.created", version=1):
    order_id: str
    total_cents: int


@app.task(queue="email")
def send_receipt(order_id: str, email: str) -> None:
    print(f"receipt for {order_id} mailed to {email}")


@app.task(queue="webhooks", keep_result=True)
async def notify_partner(order_id: str, total_cents: int) -> str:
    return f"partner told of {order_id} ({total_cents} cents)"


@app.subscribe(OrderCreated, group="analytics")
def track(event: OrderCreated) -> None:
    print(f"analytics: {event.order_id}")


api = FastAPI(lifespan=lifespan(app))  # opens the App at start-up, closes it at shutdown
mount_dashboard(api, app, "/ops/jobs")  # loopback clients only, unless auth=Auth(token=...)


@api.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, str]:
    ORDERS[order.id] = order.total_cents
    mail = await send_receipt.aenqueue(order.id, order.email)  # await: never block the loop
    hook = await notify_partner.aenqueue(order.id, order.total_cents)
    await app.apublish(OrderCreated(order_id=order.id, total_cents=order.total_cents))
    return {"receipt_job": mail.id, "webhook_job": hook.id}


def main() -> None:
    from starlette.testclient import TestClient

    from dumbwaiter.testing import drain_sync

    with TestClient(api, client=("127.0.0.1", 50000)) as client:
        jobs = client.post(
            "/orders", json={"id": "o-1", "email": "ann@example.com", "total_cents": 1299}
        ).json()
        print("enqueued:", sorted(jobs))
        drain_sync(app)  # a worker, in-process, until the queues are empty
        print("webhook:", app.job(jobs["webhook_job"]).result(timeout=10))
        page = client.get("/ops/jobs/")
        print("dashboard:", page.status_code, "webhooks" in page.text)


if __name__ == "__main__":
    main()
