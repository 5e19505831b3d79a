"""FastAPI: an order endpoint that publishes an event, with the dashboard mounted.

    uvicorn main:api                 # serve it (POST /orders, dashboard at /ops/jobs/)
    dumbwaiter worker --app main:app # run its jobs
    python main.py                   # or: one request, a worker in-process, the results

The receipt goes through ``dumbwaiter.mail`` (SMTP when ``SMTP_HOST`` is set,
else a ``Memory`` backend that keeps what it is given), and partners hear of
the order through ``dumbwaiter.webhooks``: ``order.created`` is forwarded to
every endpoint that subscribes to it, signed per Standard Webhooks.

`python main.py` uses a throwaway SQLite file, starts a partner's receiver
on 127.0.0.1 (which verifies each webhook's signature), registers it as an
endpoint, drives the API with Starlette's TestClient (which runs the
lifespan) and runs the jobs with dw.testing.drain.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

import dumbwaiter as dw
from dumbwaiter.contrib.fastapi import lifespan, mount_dashboard
from dumbwaiter.mail import Mailer, Memory, Templates
from dumbwaiter.mail.backends import Backend
from dumbwaiter.webhooks import WebhookVerificationError, new_secret, verify

app = dw.App(os.environ.get("DUMBWAITER_URL") or f"sqlite:///{tempfile.mkdtemp()}/shop.db")
ORDERS: dict[str, int] = {}  # stands in for your database


class Order(BaseModel):
    id: str
    email: str
    total_cents: int


class OrderCreated(dw.Event, type="order.created", version=1):
    order_id: str
    total_cents: int


def mail_backend() -> Backend:
    """SMTP in production; in this file's own run, a backend that keeps the mail."""
    if host := os.environ.get("SMTP_HOST"):
        from dumbwaiter.mail import SMTP

        return SMTP(host, int(os.environ.get("SMTP_PORT") or 587), start_tls=True)
    return Memory()


mailer = Mailer(  # registers the task dumbwaiter.mail.send, queue "mail"
    app,
    mail_backend(),
    sender="Shop <shop@example.com>",
    templates=Templates(
        {
            "receipt": {
                "subject": "Your order {{ order_id }}",
                "text": "Thank you! Order {{ order_id }}: {{ '%.2f' % (cents / 100) }} EUR.",
            }
        }
    ),
)
app.webhooks.forward(OrderCreated)  # published order.created events go to the endpoints


@app.subscribe(OrderCreated, group="analytics")
def track(event: OrderCreated) -> None:
    print(f"analytics: {event.order_id}")


api = FastAPI(lifespan=lifespan(app))  # opens the App at start-up, closes it at shutdown
mount_dashboard(api, app, "/ops/jobs")  # loopback clients only, unless auth=Auth(token=...)


@api.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, str]:
    ORDERS[order.id] = order.total_cents
    receipt = await mailer.asend(  # await: never block the loop
        to=order.email,
        template="receipt",
        context={"order_id": order.id, "cents": order.total_cents},
    )
    event = OrderCreated(order_id=order.id, total_cents=order.total_cents)
    event_id = await app.apublish(event)  # webhooks to subscribed endpoints, and analytics
    return {"receipt_job": receipt.id, "event": event_id}


# -- a partner's receiver: what the endpoint's owner runs ------------------------

partner = FastAPI()
RECEIVED: list[dict[str, str]] = []
PARTNER_SECRET = new_secret()  # the endpoint's secret, given to the partner once


@partner.post("/hooks")
async def receive(request: Request) -> Response:
    body = await request.body()  # the raw bytes: verify before parsing
    try:
        verify(PARTNER_SECRET, request.headers, body)
    except WebhookVerificationError:
        return Response(status_code=400)
    if request.headers["webhook-id"] not in {r["id"] for r in RECEIVED}:  # de-duplicate
        RECEIVED.append({"id": request.headers["webhook-id"], "body": body.decode()})
    return Response(status_code=204)


@contextmanager
def serve_partner() -> Iterator[str]:
    """The partner's receiver on a free 127.0.0.1 port, in a thread."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(partner, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the partner's receiver did not start")
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hooks"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main() -> None:
    from starlette.testclient import TestClient

    from dumbwaiter.testing import drain_sync

    # endpoint URLs come from users, so loopback is refused unless allowed:
    # this run allows exactly the partner's address
    app.webhooks.configure(allow=["127.0.0.1/32"])
    with serve_partner() as url, TestClient(api, client=("127.0.0.1", 50000)) as client:
        ep = app.webhooks.add_endpoint(url, event_types=["order.created"], secret=PARTNER_SECRET)
        jobs = client.post(
            "/orders", json={"id": "o-1", "email": "ann@example.com", "total_cents": 1299}
        ).json()
        print("enqueued:", sorted(jobs))
        drain_sync(app)  # a worker, in-process, until the queues are empty
        outcome = app.job(jobs["receipt_job"]).result(timeout=10)
        print(f"mail: {outcome['status']} to {', '.join(outcome['recipients'])}")
        if isinstance(mailer.backend, Memory):
            sent = mailer.backend.outbox[-1]
            print(f"mail subject: {sent.subject} | {sent.text}")
        for hook in RECEIVED:
            print(f"webhook received, signature verified: {hook['id']} {hook['body']}")
        [health] = app.webhooks.health(ep.id)
        print(f"endpoint: {health['delivered']} delivered, breaker {health['breaker']}")
        page = client.get("/ops/jobs/")
        print("dashboard:", page.status_code, "webhooks" in page.text)


if __name__ == "__main__":
    main()
