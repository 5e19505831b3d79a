"""The demo shop that ``dumbwaiter demo`` runs: an order API and its background work.

Workers import this module (``dumbwaiter worker --app dumbwaiter.demo:app``),
so it holds only the app, its three tasks and the order endpoint; the story
around them (partner server, workers, live table, report) is in
``dumbwaiter.demo.story`` and is never imported by a worker.

Everything lives in one directory, named by ``$DUMBWAITER_DEMO_DIR`` (the
current directory when unset): ``jobs.db`` is the broker's SQLite file,
``shop.db`` the shop's own database (orders, and the receipts and analytics
events the tasks record, so the demo can check that every job was done).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dumbwaiter as dw

#: the directory of the demo's databases (set by ``dumbwaiter demo`` for its workers)
DIR_ENV = "DUMBWAITER_DEMO_DIR"

EMAIL, ANALYTICS, WEBHOOKS = "email", "analytics", "webhooks"
QUEUES = (EMAIL, ANALYTICS, WEBHOOKS)

#: the demo's short schedule for webhooks: 3 attempts, 0.5 s then 1 s apart.
#: Production code keeps the default, ``dw.Retry()``: 4 attempts, 5 s, 30 s, 5 min.
WEBHOOK_RETRY = dw.Retry(attempts=3, backoff=(0.5, 1.0))


def demo_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or ".").resolve()


def broker_url(directory: Path) -> str:
    """``sqlite:////abs/path/jobs.db`` for the demo directory ``directory``."""
    return f"sqlite:///{directory.resolve() / 'jobs.db'}"


def shop_path(directory: Path) -> Path:
    return directory.resolve() / "shop.db"


app = dw.App(broker_url(demo_dir()))
SHOP_DB = shop_path(demo_dir())

SHOP_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id          TEXT PRIMARY KEY,
    email       TEXT NOT NULL,
    total_cents INTEGER NOT NULL,
    created_at  REAL NOT NULL
);
-- What the tasks did.  Keyed by order: a job that runs twice (at-least-once
-- delivery) leaves one row, so duplicates are harmless.
CREATE TABLE IF NOT EXISTS receipts (
    order_id TEXT PRIMARY KEY,
    email    TEXT NOT NULL,
    job_id   TEXT NOT NULL,
    sent_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS analytics_events (
    order_id    TEXT PRIMARY KEY,
    total_cents INTEGER NOT NULL,
    job_id      TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
"""


def shop_connect(path: Path | None = None) -> sqlite3.Connection:
    """A connection to the shop's database (autocommit; WAL, set by ``create_shop``)."""
    conn = sqlite3.connect(path or SHOP_DB, timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def create_shop(path: Path) -> None:
    """Create the shop's database and tables."""
    with closing(sqlite3.connect(path, timeout=30.0, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SHOP_SCHEMA)


def _record(sql: str, params: tuple[Any, ...]) -> None:
    with closing(shop_connect()) as conn:
        conn.execute(sql, params)


# -- the tasks -----------------------------------------------------------------


class PartnerUnavailable(Exception):
    """The partner's webhook endpoint answered with an HTTP error (retried)."""


#: no proxies: the demo's only traffic is to 127.0.0.1
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@app.task(queue=EMAIL, timeout=10)
def send_receipt(order_id: str, email: str, ctx: dw.Context) -> None:
    """E-mail the receipt: a sync task (a few ms at the "mail provider")."""
    time.sleep(random.uniform(0.002, 0.006))
    _record(
        "INSERT OR IGNORE INTO receipts (order_id, email, job_id, sent_at) VALUES (?, ?, ?, ?)",
        (order_id, email, ctx.job_id, time.time()),
    )


@app.task(queue=ANALYTICS, timeout=10)
async def track_order(order_id: str, total_cents: int, ctx: dw.Context) -> None:
    """Send an analytics event: an async task, run on the worker's event loop."""
    await asyncio.sleep(random.uniform(0.001, 0.003))  # the analytics API
    await asyncio.to_thread(
        _record,
        "INSERT OR IGNORE INTO analytics_events (order_id, total_cents, job_id, recorded_at)"
        " VALUES (?, ?, ?, ?)",
        (order_id, total_cents, ctx.job_id, time.time()),
    )


@app.task(queue=WEBHOOKS, retry=WEBHOOK_RETRY, timeout=10)
def notify_partner(order_id: str, total_cents: int, endpoint: str, ctx: dw.Context) -> None:
    """POST the order to a partner's webhook; an HTTP error fails the attempt.

    The job id travels as ``Idempotency-Key``, so the partner can drop a
    second delivery of the same job.
    """
    if urlsplit(endpoint).hostname != "127.0.0.1":
        raise dw.Reject(f"the demo only posts to 127.0.0.1, not to {endpoint!r}")
    body = json.dumps(
        {"type": "order.created", "order_id": order_id, "total_cents": total_cents}
    ).encode()
    request = urllib.request.Request(
        endpoint,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.job_id,
            "X-Attempt": str(ctx.attempt),
        },
    )
    try:
        with _opener.open(request, timeout=5) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        exc.close()
        raise PartnerUnavailable(f"partner answered HTTP {exc.code} {exc.reason}") from None


# -- the order endpoint ----------------------------------------------------------


def place_order(
    conn: sqlite3.Connection, order_id: str, email: str, total_cents: int, partner_endpoint: str
) -> None:
    """What ``POST /orders`` does before it answers: save the order, enqueue the rest.

    The slow, fallible work (mail, analytics, the partner's webhook) is only
    enqueued, so the API's latency is one insert plus three durable enqueues,
    whatever the mail provider or the partner are doing right now.
    """
    conn.execute(
        "INSERT INTO orders (id, email, total_cents, created_at) VALUES (?, ?, ?, ?)",
        (order_id, email, total_cents, time.time()),
    )
    send_receipt.enqueue(order_id, email)
    track_order.enqueue(order_id, total_cents)
    notify_partner.enqueue(order_id, total_cents, partner_endpoint)


TASKS = {EMAIL: send_receipt, ANALYTICS: track_order, WEBHOOKS: notify_partner}

__all__ = [
    "ANALYTICS",
    "DIR_ENV",
    "EMAIL",
    "QUEUES",
    "TASKS",
    "WEBHOOKS",
    "WEBHOOK_RETRY",
    "PartnerUnavailable",
    "app",
    "broker_url",
    "create_shop",
    "notify_partner",
    "place_order",
    "send_receipt",
    "shop_connect",
    "shop_path",
    "track_order",
]
