"""FastAPI with ``dumbwaiter.contrib.fastapi``, driven through Starlette's
TestClient (which runs the app's lifespan): an order endpoint enqueues with
``aenqueue`` and the jobs are stored and run, the dashboard answers at its
mount path, the lifespan closes the broker's connections, and a sync enqueue
inside an async endpoint warns."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.testclient import TestClient

import dumbwaiter as dw
from dumbwaiter.blocking import BlockingCallWarning
from dumbwaiter.contrib.fastapi import lifespan, mount_dashboard
from dumbwaiter.errors import BrokerError
from dumbwaiter.testing import drain_sync
from tests.integration.redis.server import new_prefix
from tests.integration.redis.server import url as redis_url
from tests.waiting import wait_until


class Order(BaseModel):
    id: str
    total_cents: int


class OrderCreated(dw.Event, type="fastapi.order.created", version=1):
    order_id: str
    total_cents: int


class Shop:
    """The order service of the issue: POST /orders saves the order, enqueues
    a receipt and a partner webhook, and publishes ``fastapi.order.created``."""

    def __init__(self, url: str, **lifespan_options: Any) -> None:
        self.app = app = dw.App(url)
        self.orders: dict[str, int] = {}
        self.mailed: list[str] = []
        self.notified: list[tuple[str, int]] = []
        self.seen: list[str] = []

        @app.task
        def send_receipt(order_id: str) -> None:
            self.mailed.append(order_id)

        @app.task(keep_result=True)
        async def notify_partner(order_id: str, total_cents: int) -> str:
            self.notified.append((order_id, total_cents))
            return f"partner told of {order_id}"

        @app.subscribe(OrderCreated, group="analytics")
        def track(event: OrderCreated) -> None:
            self.seen.append(event.order_id)

        self.send_receipt = send_receipt
        api = FastAPI(lifespan=lifespan(app, **lifespan_options))
        mount_dashboard(api, app, "/ops/jobs")

        @api.post("/orders")
        async def create_order(order: Order, request: Request) -> dict[str, str]:
            assert request.state.dumbwaiter is app  # the lifespan's state
            self.orders[order.id] = order.total_cents
            mail = await send_receipt.aenqueue(order.id)
            hook = await notify_partner.aenqueue(order.id, order.total_cents)
            await app.apublish(OrderCreated(order_id=order.id, total_cents=order.total_cents))
            return {"mail": mail.id, "webhook": hook.id}

        @api.post("/orders-blocking")
        async def create_order_blocking(order: Order) -> dict[str, str]:
            return {"mail": send_receipt.enqueue(order.id).id}  # the mistake

        @api.post("/orders-sync")
        def create_order_sync(order: Order) -> dict[str, str]:
            return {"mail": send_receipt.enqueue(order.id).id}  # runs in a thread: fine

        @api.get("/health")
        async def health() -> dict[str, bool]:
            return {"ok": True}

        self.api = api


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    return redis_url(new_prefix())


def test_post_orders_enqueues_jobs_that_run(url: str) -> None:
    shop = Shop(url)
    with TestClient(shop.api) as client:
        r = client.post("/orders", json={"id": "o-1", "total_cents": 1200})
        assert r.status_code == 200, r.text
        ids = r.json()
        mail, hook = shop.app.job(ids["mail"]), shop.app.job(ids["webhook"])
        assert mail.status() == "ready" and hook.status() == "ready"  # stored, not run
        info = hook.info()
        assert info is not None and info.message.args == ["o-1", 1200]
        assert shop.orders == {"o-1": 1200} and shop.mailed == []

        worker = drain_sync(shop.app)
        assert shop.mailed == ["o-1"]
        assert shop.notified == [("o-1", 1200)]
        assert shop.seen == ["o-1"]
        assert hook.result(timeout=5) == "partner told of o-1"
        assert worker.counts["succeeded"] == 3 and worker.counts["dead"] == 0


def test_the_dashboard_answers_at_its_mount_path(url: str) -> None:
    shop = Shop(url)
    with TestClient(shop.api, client=("127.0.0.1", 50000)) as client:
        job = client.post("/orders", json={"id": "o-2", "total_cents": 5}).json()["mail"]
        page = client.get("/ops/jobs/")
        assert page.status_code == 200
        assert "default" in page.text  # the queue of the order's jobs
        assert 'href="/ops/jobs/' in page.text  # links stay under the mount path
        detail = client.get(f"/ops/jobs/jobs/{job}")
        assert detail.status_code == 200 and job in detail.text and "o-2" in detail.text
        assert client.get("/jobs/" + job).status_code == 404  # only under the mount
    with TestClient(shop.api, client=("203.0.113.9", 50000)) as client:
        # mounted, it keeps its guard: without auth, only loopback clients
        assert client.get("/ops/jobs/").status_code == 403


def test_a_sync_enqueue_in_an_async_endpoint_warns(url: str) -> None:
    shop = Shop(url)
    with TestClient(shop.api) as client:
        with pytest.warns(BlockingCallWarning, match="await send_receipt.aenqueue") as caught:
            r = client.post("/orders-blocking", json={"id": "o-3", "total_cents": 1})
        assert r.status_code == 200  # it still works
        assert [w.filename for w in caught.list] == [__file__]  # names the endpoint's line
        # a sync endpoint runs in a thread where no loop runs: silent (an
        # error here, where warnings are errors)
        r = client.post("/orders-sync", json={"id": "o-4", "total_cents": 1})
        assert r.status_code == 200
        assert shop.app.job(r.json()["mail"]).status() == "ready"


def _clients(name: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(redis_url(new_prefix()).split("?")[0])
    try:
        return [c["name"] for c in client.client_list() if c["name"] == name]
    finally:
        client.close()


def test_the_lifespan_opens_and_closes_the_broker() -> None:
    """On Redis, every connection carries the App's client name: the server
    sees them from start-up (before any request) until shutdown, and not after."""
    name = f"dwfw{secrets.token_hex(4)}"
    shop = Shop(redis_url(new_prefix(), client_name=name))
    with TestClient(shop.api) as client:
        assert _clients(name), "the lifespan did not connect at start-up"
        assert client.post("/orders", json={"id": "o-5", "total_cents": 1}).status_code == 200
        shop.send_receipt.enqueue("o-6")  # the sync producer's own connection, too
        assert len(_clients(name)) >= 2
    wait_until(lambda: not _clients(name), "the App's Redis connections to close")


def test_the_lifespan_runs_the_users_own_inside_and_merges_its_state(tmp_path: Path) -> None:
    steps: list[str] = []

    @contextlib.asynccontextmanager
    async def mine(api: FastAPI) -> AsyncIterator[dict[str, Any]]:
        job = await send_receipt.aenqueue("at start-up")  # the App is open already
        steps.append(f"start {await job.astatus()}")
        yield {"cache": "warm"}
        steps.append("stop")

    app = dw.App(f"sqlite:///{tmp_path}/jobs.db")

    @app.task
    def send_receipt(order_id: str) -> None: ...

    api = FastAPI(lifespan=lifespan(app, inner=mine))

    @api.get("/state")
    async def state(request: Request) -> dict[str, str]:
        return {"cache": request.state.cache, "app": repr(request.state.dumbwaiter)}

    with TestClient(api) as client:
        assert client.get("/state").json() == {"cache": "warm", "app": repr(app)}
        assert steps == ["start ready"]
    assert steps == ["start ready", "stop"]


def test_an_unreachable_broker_fails_the_start() -> None:
    """The start-up check's round trip: the server does not start serving
    requests that would all fail; ``check=False`` starts anyway."""
    dead = "redis://127.0.0.1:1/0?reconnect=0.5"
    with pytest.raises(BrokerError, match=r"127\.0\.0\.1:1"), TestClient(Shop(dead).api):
        pass
    with TestClient(Shop(dead, check=False).api) as client:
        assert client.get("/health").json() == {"ok": True}
