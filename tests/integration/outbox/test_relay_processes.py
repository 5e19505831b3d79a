"""The relay as real processes: SIGKILLed mid-batch, and several at once."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import dumbwaiter as dw
from dumbwaiter.message import decode
from dumbwaiter.relay import Relay
from tests.apps import outboxapp
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
N = 3000


def _fill_shop(app: dw.App, shop: Path) -> None:
    conn = sqlite3.connect(shop)
    conn.execute("PRAGMA journal_mode=WAL")  # an application database, as most run it
    conn.execute("CREATE TABLE ledger (n INTEGER)")
    for start in range(0, N, 500):
        with conn:  # committed in transactions of 500 orders
            for n in range(start, start + 500):
                app.outbox(conn).publish(outboxapp.OrderPaid(n=n))
    conn.close()


def _count(shop: Path, sql: str) -> int:
    conn = sqlite3.connect(shop, timeout=30)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def _published(app: dw.App) -> list[str]:
    """The ids of the events the broker's event log holds (each publish it kept)."""

    async def go() -> list[str]:
        ids: list[str] = []
        cursor = None
        while True:
            page, cursor = await app.broker.list_events(
                outboxapp.OrderPaid.event_type, cursor=cursor, limit=1000
            )
            ids += [m.id for m in page]
            if cursor is None:
                return ids

    return asyncio.run(go())


def _relayed(conn: sqlite3.Connection) -> set[str]:
    """The ids of the outbox rows marked relayed."""
    rows = conn.execute("SELECT body FROM dw_outbox WHERE relayed_at IS NOT NULL")
    return {decode(bytes(body)).id for (body,) in rows}


def test_relay_killed_mid_batch_loses_nothing_and_duplicates_are_dropped(tmp_path: Path) -> None:
    """The relay is SIGKILLed between sending a batch and marking it (the
    test holds the shop database's write lock, so the mark waits), so the
    next relay sends that batch again: the broker gets each of those events
    twice, keeps one and delivers it once, and the ledger has each order once."""
    url, shop = f"sqlite:///{tmp_path}/broker.db", tmp_path / "shop.db"
    app = dw.App(url)
    app.subscribe(outboxapp.OrderPaid, group="ledger")(outboxapp.ledger.fn)
    asyncio.run(app._declare())
    _fill_shop(app, shop)
    env = {
        **os.environ,
        "OUTBOXAPP_URL": url,
        "OUTBOXAPP_SHOP": str(shop),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout's code
    }
    relay_cmd = [sys.executable, "-m", "dumbwaiter", "relay", "--app", "tests.apps.outboxapp:app",
                 "--source", f"sqlite:///{shop}", "--batch", "100", "--lease", "1",
                 "--log-level", "WARNING"]  # fmt: skip
    worker_cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app",
                  "tests.apps.outboxapp:app", "-c", "16", "--log-level", "WARNING"]  # fmt: skip
    relay = subprocess.Popen(relay_cmd, cwd=ROOT, env=env)
    worker = subprocess.Popen(worker_cmd, cwd=ROOT, env=env)
    try:
        wait_until(
            lambda: (
                _count(shop, "SELECT count(*) FROM dw_outbox WHERE relayed_at IS NOT NULL")
                >= N // 3
            ),
            "a third of the rows to be relayed",
        )
        lock = sqlite3.connect(shop, timeout=30, isolation_level=None)
        try:
            lock.execute("BEGIN IMMEDIATE")  # no mark can land from now on
            relayed = _relayed(lock)
            wait_until(
                lambda: len(set(_published(app)) - relayed) > 0,
                "the relay to send a batch it cannot mark",
            )
            relay.send_signal(signal.SIGKILL)  # between its send and its mark
            assert relay.wait(timeout=10) == -signal.SIGKILL
            sent_unmarked = set(_published(app)) - relayed
        finally:
            lock.rollback()
            lock.close()
        relay = subprocess.Popen(relay_cmd, cwd=ROOT, env=env)
        wait_until(
            lambda: _count(shop, "SELECT count(*) FROM ledger") >= N,
            "every order to reach the ledger",
            120,
        )
        wait_until(
            lambda: _count(shop, "SELECT count(*) FROM dw_outbox WHERE relayed_at IS NULL") == 0,
            "every row to be marked relayed",
        )
    finally:
        for p in (relay, worker):
            p.send_signal(signal.SIGTERM)
        for p in (relay, worker):
            p.wait(timeout=30)
    # the rows the killed relay had sent were sent again by the next one: it
    # marks a row only once it has sent it itself
    assert sent_unmarked
    conn = sqlite3.connect(shop)
    try:
        assert sent_unmarked <= _relayed(conn)
    finally:
        conn.close()
    # the second copies were dropped: one event each in the log, one delivery each
    published = _published(app)
    assert len(published) == len(set(published)) == N
    [stats] = [s for s in asyncio.run(app.broker.stats()) if s.queue == "group:ledger"]
    assert (stats.succeeded, stats.ready, stats.running, stats.dead) == (N, 0, 0, 0)
    assert _count(shop, "SELECT count(*) FROM ledger") == N  # each effect once
    assert _count(shop, "SELECT count(DISTINCT n) FROM ledger") == N
    app.close()


def test_several_relays_hand_each_row_to_one(tmp_path: Path) -> None:
    url, shop = f"sqlite:///{tmp_path}/broker.db", tmp_path / "shop.db"
    app = dw.App(url)
    app.subscribe(outboxapp.OrderPaid, group="ledger")(outboxapp.ledger.fn)
    asyncio.run(app._declare())
    _fill_shop(app, shop)
    relays = [Relay(app, f"sqlite:///{shop}", batch=200, lease=5.0) for _ in range(3)]

    def left() -> int:
        return _count(shop, "SELECT count(*) FROM dw_outbox WHERE relayed_at IS NULL")

    async def run() -> None:
        tasks = [asyncio.create_task(r.run()) for r in relays]
        while left() > 0:  # noqa: ASYNC110 - the outbox lives in another database
            await asyncio.sleep(0.02)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    assert sum(r.relayed for r in relays) == N  # no row was sent by two relays
    [stats] = [s for s in asyncio.run(app.broker.stats()) if s.queue == "group:ledger"]
    assert stats.ready == N
    app.close()
