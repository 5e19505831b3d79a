"""A claim that meets another connection's write lock (an idle worker is
woken by a producer's first write to the WAL, before that producer's commit
has synced and let go of the lock) polls the lock itself for a few
milliseconds instead of waiting out the 1 ms first sleep of SQLite's busy
handler, then leaves a lock held longer to that handler: either way it gets
the job once the lock is let go, and the connection keeps its busy timeout
for every other statement."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from dumbwaiter.brokers.sqlite import connection as sqlite_connection
from dumbwaiter.brokers.sqlite.broker import SQLiteBroker
from tests.conformance.conftest import msg


@pytest.mark.parametrize("spin", ["polled", "past the spin"])
async def test_a_claim_that_meets_a_held_write_lock_gets_the_job_once_it_is_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spin: str
) -> None:
    if spin == "past the spin":
        # the lock is still held when the polling ends: SQLite's handler waits
        monkeypatch.setattr(sqlite_connection, "CLAIM_LOCK_SPIN", 0.0)
    b = SQLiteBroker(f"sqlite:///{tmp_path}/q.db?busy_timeout=20")
    await b.open()
    other = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    try:
        await b.declare(["default"], [])
        m = msg()
        await b.enqueue([m])
        # every BEGIN the broker's own connection tries, from its thread
        begins = 0
        retried = threading.Event()

        def trace(statement: str) -> None:
            nonlocal begins
            if statement == "BEGIN IMMEDIATE":
                begins += 1
                if begins >= 2:
                    retried.set()

        await b._run(lambda: b._worker_conn().set_trace_callback(trace))
        other.execute("BEGIN IMMEDIATE")  # a producer in the middle of its commit
        claim = asyncio.create_task(b.fetch(["default"], 10, 30.0, 0, "w"))
        # the claim met the lock and tries again (itself, or in SQLite's handler)
        assert await asyncio.to_thread(retried.wait, 10.0)
        assert not claim.done()
        other.execute("COMMIT")
        [d] = await claim
        assert d.id == m.id
        await b._run(lambda: b._worker_conn().set_trace_callback(None))
        # the broker's other statements still wait the busy timeout for the lock
        timeout = await b._run(lambda: b._worker_conn().execute("PRAGMA busy_timeout").fetchone())
        assert timeout == (20_000,)
    finally:
        other.close()
        await b.close()
