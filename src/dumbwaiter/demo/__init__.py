"""The demo shop that ``dumbwaiter demo`` runs: an order API and its background work.

Workers import this module (``dumbwaiter worker --app dumbwaiter.demo:app``),
so it holds only the app, its mailer, its webhook settings, the analytics
task and the order endpoint; the story around them (the partner's receiver,
workers, live table, report) is in ``dumbwaiter.demo.story`` and is never
imported by a worker.

The slow work is what a real shop does, with the library's own senders:
the receipt goes through ``dumbwaiter.mail`` (to a folder of ``.eml``
files: ``MailFolder``), the partner hears of the order through
``dumbwaiter.webhooks`` (signed, retried, with a circuit breaker), and the
analytics event is a plain task.

Everything lives in one directory, named by ``$DUMBWAITER_DEMO_DIR`` (the
current directory when unset): ``jobs.db`` is the broker's SQLite file,
``shop.db`` the shop's own database (orders, and the analytics events the
task records), ``mail/`` the receipts the mailer wrote.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import dumbwaiter as dw

from ..errors import MissingDependency

try:
    from ..mail import Mailer
    from ..mail.templates import Templates  # Jinja2
    from ..webhooks import Webhooks, new_secret  # standardwebhooks, httpx
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingDependency(
        f"the demo sends its mail and webhooks with dumbwaiter.mail and dumbwaiter.webhooks "
        f"({exc}); pip install 'dumbwaiter[mail,webhooks]' (make demo does)"
    ) from exc
from .mailbox import MailFolder

#: the directory of the demo's databases (set by ``dumbwaiter demo`` for its workers)
DIR_ENV = "DUMBWAITER_DEMO_DIR"

EMAIL, ANALYTICS, WEBHOOKS = "email", "analytics", "webhooks"
QUEUES = (EMAIL, ANALYTICS, WEBHOOKS)
#: the partner's webhook endpoint (registered by the story, in the broker's kv store)
PARTNER = "ep_partner"

#: the demo's short schedule for webhooks: 3 attempts, 0.5 s then 1 s apart
#: (or what the partner's Retry-After asks).  Production code keeps the
#: default, the Standard Webhooks schedule: 10 attempts over about 3 days.
WEBHOOK_RETRY = dw.Retry(attempts=3, backoff=(0.5, 1.0))
#: the circuit breaker opens after this many failures in a row; its cool-down
#: starts at 0.5 s and doubles up to 1 s (production: 30 s up to 10 min)
BREAKER_THRESHOLD = 5


def demo_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or ".").resolve()


def broker_url(directory: Path) -> str:
    """``sqlite:////abs/path/jobs.db`` for the demo directory ``directory``."""
    return f"sqlite:///{directory.resolve() / 'jobs.db'}"


def shop_path(directory: Path) -> Path:
    return directory.resolve() / "shop.db"


def mail_path(directory: Path) -> Path:
    return directory.resolve() / "mail"


app = dw.App(broker_url(demo_dir()))
SHOP_DB = shop_path(demo_dir())

#: the receipt, written as .eml files into the demo directory's mail/
mailer = Mailer(
    app,
    MailFolder(mail_path(demo_dir())),
    sender="Demo Shop <shop@example.com>",
    queue=EMAIL,
    templates=Templates(
        {
            "receipt": {
                "subject": "Your receipt for order {{ order_id }}",
                "text": "Thank you for your order {{ order_id }} ({{ product }}).\n"
                "Total: {{ '%.2f' % (total_cents / 100) }} EUR\n",
                "html": "<p>Thank you for your order <b>{{ order_id }}</b> ({{ product }}).</p>"
                "<p>Total: {{ '%.2f' % (total_cents / 100) }} EUR</p>",
            }
        }
    ),
)

#: the partner's receiver runs on 127.0.0.1, which the SSRF guard refuses
#: unless allowed: the demo allows exactly that address, nothing else private
webhooks: Webhooks = app.webhooks
webhooks.configure(
    queue=WEBHOOKS,
    retry=WEBHOOK_RETRY,
    allow=["127.0.0.1/32"],
    timeout=5,
    connect_timeout=2,
    breaker_threshold=BREAKER_THRESHOLD,
    breaker_cooldown=0.5,
    breaker_max_cooldown=1,
)

SHOP_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id          TEXT PRIMARY KEY,
    email       TEXT NOT NULL,
    product     TEXT NOT NULL,
    total_cents INTEGER NOT NULL,
    created_at  REAL NOT NULL
);
-- What the analytics task did.  Keyed by order: a job that runs twice
-- (at-least-once delivery) leaves one row, so duplicates are harmless.
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


# -- the one task of its own -------------------------------------------------------


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


# -- the partner's endpoint and the order endpoint -----------------------------------


async def register_partner(url: str) -> str:
    """Register the partner's receiver as the webhook endpoint ``PARTNER``, with
    a new secret; returns the secret (the partner verifies signatures with it)."""
    secret = new_secret()
    await app.webhooks.aadd_endpoint(
        url,
        id=PARTNER,
        secret=secret,
        event_types=["order.created"],
        description="the demo's partner (127.0.0.1)",
    )
    return secret


def receipt_id(order_id: str) -> str:
    """The receipt's Message-ID: one per order, so a second send of it is not
    a second mail (the mailer keeps a record of the Message-IDs it sent)."""
    return f"<receipt-{order_id}@shop.example.com>"


def place_order(
    conn: sqlite3.Connection, order_id: str, email: str, product: str, total_cents: int
) -> None:
    """What ``POST /orders`` does before it answers: save the order, enqueue the rest.

    The slow, fallible work (mail, analytics, the partner's webhook) is only
    enqueued, so the API's latency is one insert plus three durable enqueues,
    whatever the mail server or the partner are doing right now.
    """
    conn.execute(
        "INSERT INTO orders (id, email, product, total_cents, created_at) VALUES (?, ?, ?, ?, ?)",
        (order_id, email, product, total_cents, time.time()),
    )
    mailer.send(
        to=email,
        template="receipt",
        context={"order_id": order_id, "product": product, "total_cents": total_cents},
        message_id=receipt_id(order_id),
    )
    track_order.enqueue(order_id, total_cents)
    app.webhooks.send(
        PARTNER,
        "order.created",
        {"order_id": order_id, "product": product, "total_cents": total_cents},
        webhook_id=f"order-{order_id}",
    )


#: what runs on each queue, as the demo's tables name it
TASKS = {EMAIL: mailer.task, ANALYTICS: track_order, WEBHOOKS: app.webhooks.task}
LABELS = {EMAIL: "mailer (receipt)", ANALYTICS: "track_order", WEBHOOKS: "webhooks (partner)"}

__all__ = [
    "ANALYTICS",
    "DIR_ENV",
    "EMAIL",
    "LABELS",
    "PARTNER",
    "QUEUES",
    "TASKS",
    "WEBHOOKS",
    "WEBHOOK_RETRY",
    "app",
    "broker_url",
    "create_shop",
    "mail_path",
    "mailer",
    "place_order",
    "receipt_id",
    "register_partner",
    "shop_connect",
    "shop_path",
    "track_order",
]
