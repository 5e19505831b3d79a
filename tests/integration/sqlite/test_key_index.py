"""Search by key on SQLite is an index probe.

``dw_jobs.msg_key`` holds every job's ``Message.key`` (schema version 2).
Every path that stores a job fills it; a database made by a pre-release
(schema version 1, without it) is refused with what to do, and so is one
made by a newer dumbwaiter.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.sqlite.broker import SCHEMA_VERSION, SQLiteBroker
from dumbwaiter.brokers.types import Binding, JobFilter
from dumbwaiter.errors import ConfigurationError
from dumbwaiter.message import EVENT, Message, encode, uuid7
from dumbwaiter.sqldb import adapt
from dumbwaiter.state import State
from tests.conformance.conftest import msg

V1 = (Path(__file__).parent / "schema_v1.sql").read_text()


def _broker(path: Path) -> SQLiteBroker:
    b = from_url(f"sqlite:///{path}")
    assert isinstance(b, SQLiteBroker)
    return b


async def _keys(broker: SQLiteBroker, key: str, **kw: Any) -> list[str]:
    page = await broker.list_jobs(JobFilter(key=key, **kw), limit=1000)
    return [i.message.id for i in page.items]


def _plans(broker: SQLiteBroker, call: Any) -> list[str]:
    """The query plans of the statements ``call`` runs on the broker's connection."""
    conn = broker._worker_conn()
    seen: list[str] = []
    conn.set_trace_callback(seen.append)  # the statements, parameters bound
    try:
        call()
    finally:
        conn.set_trace_callback(None)
    plans = []
    for stmt in seen:
        if "dw_jobs" in stmt and stmt.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
            rows = conn.execute("EXPLAIN QUERY PLAN " + stmt).fetchall()
            plans.append(" | ".join(r[3] for r in rows))
    return plans


def _v1_database(path: Path, rows: list[tuple[Any, ...]]) -> None:
    """A database as dumbwaiter's schema version 1 made and filled it."""
    c = sqlite3.connect(path, isolation_level=None)
    c.executescript(f"BEGIN;\n{V1}\nCOMMIT;")
    c.executemany(
        "INSERT INTO dw_jobs (id, queue, name, kind, state, run_at, updated_at, max_attempts,"
        " key, body) VALUES (?, 'default', ?, ?, ?, 0, 0, 4, ?, ?)",
        rows,
    )
    c.close()


def _body(id: str, key: str | None, kind: str = "task", **kw: Any) -> bytes:
    return encode(Message(id=id, kind=kind, name="t.job", queue="default", key=key, **kw))


async def test_search_by_key_probes_the_index(tmp_path: Path) -> None:
    """The listing, replay and purge by key read dw_jobs_msg_key, not the table."""
    broker = _broker(tmp_path / "k.db")
    try:
        target = msg(key="order-42")
        await broker.enqueue([target, *(msg(args=[i]) for i in range(50))])
        listing = []
        for f in (
            JobFilter(key="order-42"),
            JobFilter(key="order-42", queue="default"),
            # the dashboard's tabs: a queue and a state, which (queue, state, id) serves too
            JobFilter(key="order-42", queue="default", state=State.READY),
        ):
            listing += _plans(broker, lambda f=f: broker._list(f, None, 5))
        assert len(listing) == 3, listing
        assert all("USING INDEX dw_jobs_msg_key" in p for p in listing), listing
        assert all("TEMP B-TREE" not in p for p in listing), listing  # no sort: index order
        changes = _plans(broker, lambda: broker._purge(JobFilter(key="nope")))
        changes += _plans(broker, lambda: broker._replay(JobFilter(key="nope")))
        assert changes and all("dw_jobs_msg_key" in p for p in changes), changes
        assert await _keys(broker, "order-42") == [target.id]
    finally:
        await broker.close()


async def test_every_enqueue_path_stores_the_key(tmp_path: Path) -> None:
    """Bulk, sync, async, event deliveries and the outbox's fast path (the
    caller's own sqlite3 transaction) all write msg_key."""
    path = tmp_path / "paths.db"
    broker = _broker(path)
    try:
        bulk = [msg(key=f"bulk-{i}") for i in range(2500)]  # more than one INSERT
        await broker.enqueue(bulk)
        one = msg(key="sync-1")
        broker.enqueue_sync([one])
        await broker.declare(["group:g"], [Binding("k.happened", "group:g", 3)])
        event = Message(
            id=uuid7(),
            kind=EVENT,
            name="k.happened",
            queue="",
            payload={},
            key="event-1",
            created_at=time.time(),
        )
        broker.publish_sync([event])
        outboxed = msg(key="outbox-1")
        conn = sqlite3.connect(path)
        with conn:  # the application's transaction
            broker.enqueue_with_sync(adapt(conn), [outboxed])
        conn.close()

        assert await _keys(broker, "bulk-0") == [bulk[0].id]
        assert await _keys(broker, "bulk-2499") == [bulk[2499].id]
        assert await _keys(broker, "sync-1") == [one.id]
        assert [
            (i.message.queue, i.message.key)
            for i in (await broker.list_jobs(JobFilter(key="event-1"))).items
        ] == [("group:g", "event-1")]
        assert await _keys(broker, "outbox-1") == [outboxed.id]
        stored = (
            sqlite3.connect(path)
            .execute("SELECT count(*) FROM dw_jobs WHERE msg_key IS NOT NULL")
            .fetchone()[0]
        )
        assert stored == 2500 + 3
    finally:
        await broker.close()


async def test_a_pre_release_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A file of schema version 1 (a pre-release's tables, without msg_key) is
    refused with what to do, on open and on the outbox's fast path alike, and
    nothing in it changes: its workers can still finish its jobs."""
    path = tmp_path / "v1.db"
    held = uuid7()
    _v1_database(path, [(held, "t.job", "task", "ready", "held-1", _body(held, "held-1"))])
    b = _broker(path)
    with pytest.raises(ConfigurationError, match=r"pre-release.*delete the file"):
        await b.open()
    await b.close()
    conn = sqlite3.connect(path)
    with pytest.raises(ConfigurationError, match="pre-release"), conn:
        _broker(path).enqueue_with_sync(adapt(conn), [msg(key="x")])
    cols = {r[1] for r in conn.execute("PRAGMA table_info(dw_jobs)")}
    assert "msg_key" not in cols
    assert conn.execute("SELECT v FROM dw_meta WHERE k='schema_version'").fetchone()[0] == 1
    assert conn.execute("SELECT id FROM dw_jobs").fetchall() == [(held,)]
    conn.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    b = _broker(path)
    await b.enqueue([msg()])
    await b.close()
    c = sqlite3.connect(path)
    c.execute("UPDATE dw_meta SET v = ? WHERE k = 'schema_version'", (SCHEMA_VERSION + 1,))
    c.commit()
    c.close()
    b = _broker(path)
    with pytest.raises(ConfigurationError, match="upgrade dumbwaiter"):
        await b.open()
    await b.close()
