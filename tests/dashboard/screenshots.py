"""Take the screenshots of docs/dashboard/ (one PNG per page).

    .venv/bin/python -m tests.dashboard.screenshots [OUT_DIR] [NAME...]

(NAME: only those screenshots that have their own seed, e.g. ``workflow-run``.)

Seeds a SQLite broker with a little of everything (queues, a subscriber
group, dead letters with tracebacks, a live worker, a schedule, a firing
alert, an hour of throughput), serves the dashboard on 127.0.0.1 and
photographs each page with Debian's Chromium.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


async def seed(url: str, flag: Path) -> dict[str, str]:
    from dumbwaiter.alerts import AlertConfig, AlertService, DeadLetters, QueueDepth
    from dumbwaiter.scheduler import Scheduler
    from dumbwaiter.testing import drain
    from dumbwaiter.throughput import PREFIX, minute_of
    from tests.dashboard.dashapp import OrderPaid, create_app

    app = create_app()
    flaky, welcome, report = (
        app.tasks[n] for n in ("dashapp.flaky", "dashapp.welcome", "dashapp.report")
    )
    watcher = AlertService(
        app, AlertConfig(rules=(DeadLetters(), QueueDepth(threshold=20, for_=0)))
    )
    await watcher.evaluate(time.time())  # start watching for dead letters
    dead = [(await flaky.aenqueue(f"user{i}@example.com")).id for i in range(4)]
    await drain(app, ["mail"])
    await welcome.aenqueue_many([(i,) for i in range(37)])
    await welcome.options(delay=3600).aenqueue(1000)
    await report.options(key="report:weekly").aenqueue("weekly")
    await report.aenqueue("daily")
    for i in range(3):
        await app.apublish(OrderPaid(order=f"o-{i}"), key=f"o-{i}")
    await app.apublish(OrderPaid(order="bad"), key="bad")  # the ledger refuses it
    await drain(app, ["group:ledger"])
    for i in range(3, 5):
        await app.apublish(OrderPaid(order=f"o-{i}"), key=f"o-{i}")
    leader = Scheduler(app)
    await leader.step()
    await leader.resign()
    await watcher.evaluate(time.time())
    now = time.time()
    m = minute_of(now)
    rnd = __import__("random").Random(3)
    total = [0, 0, 0]
    samples = {}
    for k in range(60, -1, -1):
        total[0] += rnd.randint(40, 160)
        total[1] += rnd.randint(0, 8)
        total[2] += 1 if rnd.random() < 0.1 else 0
        samples[f"{PREFIX}{m - k}"] = orjson.dumps(
            {"at": now - 60 * k, "workers": {"web-1:812:a1f3": [*total, now - 7200]}}
        )
    await app.broker.kv_set(samples, ttl=7200)
    await app.aclose()
    return {"dead": dead[0]}


def main() -> None:
    from playwright.sync_api import sync_playwright

    from dumbwaiter.dashboard import Auth
    from tests.dashboard.browser import launch, serve, worker_thread
    from tests.dashboard.dashapp import create_app

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[2:])
    if only:
        unknown = only - set(OWN_SEED)
        if unknown:
            raise SystemExit(f"no screenshot of its own named {', '.join(sorted(unknown))}")
        for name in sorted(only):
            OWN_SEED[name](out)
        return
    tmp = Path(tempfile.mkdtemp(prefix="dw-shots-"))
    os.environ["DASHAPP_URL"] = f"sqlite:///{tmp}/shots.db"
    os.environ["DASHAPP_FLAG"] = str(tmp / "up")
    ids: dict[str, str] = {}

    def run_seed() -> None:
        ids.update(asyncio.run(seed(os.environ["DASHAPP_URL"], tmp / "up")))

    t = threading.Thread(target=run_seed)
    t.start()
    t.join()
    stop = threading.Event()
    app = create_app()

    @app.task(queue="reports", name="dashapp.slow")
    def slow() -> None:
        stop.wait(60)

    with serve(create_app()) as url, worker_thread(app, queues=("reports",), concurrency=4):
        asyncio.run(_enqueue_slow(app))
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            shots = [
                ("overview", "/"),
                ("queue", "/queues/mail"),
                ("job", f"/jobs/{ids['dead']}"),
                ("dead-letters", "/dead"),
                ("events", "/events"),
                ("workers", "/workers"),
                ("schedules", "/schedules"),
                ("alerts", "/alerts"),
            ]
            for name, path in shots:
                page.goto(url + path)
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                print(f"wrote {out / name}.png")
            browser.close()
        stop.set()
    with serve(create_app(), auth=Auth(token="screenshot-token-0123456789")) as url:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(url + "/queues/mail")  # signed out: the sign-in page, as a 401
            page.screenshot(path=str(out / "signin.png"))
            print(f"wrote {out / 'signin'}.png")
            browser.close()
    for shot in OWN_SEED.values():
        shot(out)


async def _enqueue_slow(app: object) -> None:
    from tests.dashboard.dashapp import create_app

    other = create_app()

    @other.task(queue="reports", name="dashapp.slow")
    def slow() -> None: ...

    await slow.aenqueue_many([() for _ in range(3)])
    await other.aclose()


def workflow_run(out: Path) -> None:
    """A checkout run (docs/durable-workflows.md's order flow) part way:
    steps done with their outputs, one failed (caught: the flow took another
    path), a sleep over, and now waiting for the customer's confirmation."""

    import dumbwaiter as dw
    from dumbwaiter.durable.api import workflows
    from tests.dashboard.browser import serve, worker_thread
    from tests.dashboard.wfapp import OrderConfirmed, charge_card, reserve
    from tests.dashboard.wfapp import create_app as create_wfapp
    from tests.waiting import wait_until

    tmp = Path(tempfile.mkdtemp(prefix="dw-shots-wf-"))
    url = f"sqlite:///{tmp}/runs.db"

    def slow(seconds: float, fn: Callable[..., T]) -> Callable[..., T]:
        def step(*args: Any) -> T:
            time.sleep(seconds)  # a step that takes a while, for the bars
            return fn(*args)

        return step

    def gift_wrap(order_id: str) -> str:
        time.sleep(0.15)
        raise LookupError(f"no gift wrap left for {order_id} in the Lyon warehouse")

    def with_checkout(app: dw.App) -> dw.App:
        @app.workflow(name="shop.checkout")
        def checkout(ctx: dw.WorkflowContext, order_id: str, cents: int) -> str:
            charge = ctx.step("charge", slow(0.35, charge_card), order_id, cents)
            ctx.step("reserve", slow(0.2, reserve), order_id)
            try:
                ctx.step("gift-wrap", gift_wrap, order_id, retry=False)
            except dw.StepFailed:
                ctx.step("apology-note", slow(0.1, lambda o: f"note queued for {o}"), order_id)
            ctx.sleep("settle", 1.5)
            event = ctx.wait_for_event(
                "confirmation", OrderConfirmed, match={"order_id": order_id}, timeout=3 * 86400
            )
            return f"{charge['id']} confirmed" if event else "expired"

        return app

    app = with_checkout(create_wfapp(url))
    run = workflows(app)["shop.checkout"].enqueue("A-1042", 4990)
    worker_app = with_checkout(create_wfapp(url))  # the worker's own, as in another process
    with worker_thread(worker_app), serve(with_checkout(create_wfapp(url))) as base:
        wait_until(lambda: run.status() == "waiting", "the run to wait for its confirmation")
        time.sleep(0.8)  # let the wait show on the time axis
        shoot(f"{base}/workflows/{run.id}", out / "workflow-run.png")
    app.close()


def shoot(url: str, png: Path) -> None:
    """One full-page screenshot of ``url`` in a browser of its own."""
    from playwright.sync_api import sync_playwright

    from tests.dashboard.browser import launch

    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.goto(url)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(png), full_page=True)
        print(f"wrote {png}")
        browser.close()


def webhooks(out: Path) -> None:
    """The endpoints page over real deliveries (tests/dashboard/hooksapp.py):
    one healthy endpoint, one with a dead delivery, one disabled by a 410,
    one whose breaker is open."""
    from tests.dashboard.browser import serve
    from tests.dashboard.hooksapp import create_app as create_hooksapp
    from tests.dashboard.hooksapp import seed as seed_hooks
    from tests.webhooks.receiver import Receiver
    from tests.webhooks.receiver import serve as serve_receiver

    tmp = Path(tempfile.mkdtemp(prefix="dw-shots-hooks-"))
    url = f"sqlite:///{tmp}/hooks.db"
    with serve_receiver(Receiver()) as receiver:
        t = threading.Thread(target=lambda: asyncio.run(seed_hooks(url, receiver)))
        t.start()
        t.join()
    with serve(create_hooksapp(url)) as base:
        shoot(f"{base}/webhooks", out / "webhooks.png")


#: screenshots with a broker of their own (``screenshots OUT_DIR NAME`` takes one alone)
OWN_SEED = {"workflow-run": workflow_run, "webhooks": webhooks}


if __name__ == "__main__":
    main()
