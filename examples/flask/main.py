"""Flask: an application factory, and a view that enqueues in a request.

    flask --app main:create_app run          # serve it (POST /orders)
    dumbwaiter worker --app main:jobs        # run its jobs
    python main.py                           # or: one request, a worker in-process

The App lives at module level (its tasks register when the module is
imported, and the worker imports this same module); the factory only
registers it with each Flask app. `python main.py` uses a throwaway SQLite
file, Flask's test client, and dw.testing.drain_sync as the worker.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from flask import Blueprint, Flask, jsonify, request
from flask.typing import ResponseReturnValue

import dumbwaiter as dw
from dumbwaiter.contrib.flask import Dumbwaiter

jobs = dw.App(os.environ.get("DUMBWAITER_URL") or f"sqlite:///{tempfile.mkdtemp()}/shop.db")
dumbwaiter = Dumbwaiter(jobs)
orders = Blueprint("orders", __name__)


@jobs.task(queue="email")
def send_receipt(order_id: str, email: str) -> None:
    print(f"receipt for {order_id} mailed to {email}")


@jobs.task(keep_result=True)
def invoice(order_id: str, total_cents: int) -> str:
    return f"invoice {order_id}: {total_cents / 100:.2f} EUR"


@orders.post("/orders")
def create_order() -> ResponseReturnValue:
    order = request.get_json()
    # a Flask view runs in a thread with no event loop: the sync API is right here
    mail = send_receipt.enqueue(order["id"], order["email"])
    bill = invoice.enqueue(order["id"], order["total_cents"])
    return jsonify(receipt_job=mail.id, invoice_job=bill.id), 201


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(config or {})
    dumbwaiter.init_app(app)
    app.register_blueprint(orders)
    return app


def main() -> None:
    from dumbwaiter.testing import drain_sync

    client = create_app({"TESTING": True}).test_client()
    r = client.post("/orders", json={"id": "o-1", "email": "ann@example.com", "total_cents": 1299})
    ids = r.get_json()
    print("enqueued:", r.status_code, sorted(ids))
    drain_sync(jobs)
    print("invoice:", jobs.job(ids["invoice_job"]).result(timeout=10))
    jobs.close()


if __name__ == "__main__":
    main()
