"""Short key-value calls run on the caller's thread (``SQLiteBroker._quick``):
one that meets another connection's write lock must wait for it on the
broker's thread, not fail, and a process that only ever writes that way must
still have its WAL checkpointed."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from dumbwaiter.brokers.sqlite import connection as sqlite_connection
from dumbwaiter.brokers.sqlite.broker import SQLiteBroker


async def test_a_write_that_meets_a_held_lock_waits_for_it(tmp_path: Path) -> None:
    b = SQLiteBroker(f"sqlite:///{tmp_path}/q.db")
    await b.open()
    other = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
        added = asyncio.create_task(b.kv_add("k", b"v"))
        updated = asyncio.create_task(b.kv_update(["n"], lambda got: ({"n": b"1"}, "ok")))
        await asyncio.sleep(0)  # both try the quick path once: the lock is taken
        assert not added.done() and not updated.done()  # waiting, not failed
        other.execute("COMMIT")
        assert await added is True
        assert await updated == "ok"
        assert await b.kv_get(["k", "n"]) == {"k": b"v", "n": b"1"}
    finally:
        other.close()
        await b.close()


async def test_kv_add_takes_over_an_expired_entry_and_keeps_a_live_one(tmp_path: Path) -> None:
    b = SQLiteBroker(f"sqlite:///{tmp_path}/q.db")
    await b.open()
    try:
        assert await b.kv_add("gone", b"old", ttl=-1.0)  # already expired
        assert await b.kv_add("gone", b"new")
        assert not await b.kv_add("gone", b"newer")
        assert await b.kv_get(["gone"]) == {"gone": b"new"}
    finally:
        await b.close()


@pytest.mark.parametrize("call", ["kv_set", "kv_add"])
async def test_quick_writes_have_the_broker_thread_checkpoint_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    monkeypatch.setattr(sqlite_connection, "QUICK_CHECKPOINT", 55)
    b = SQLiteBroker(f"sqlite:///{tmp_path}/q.db")
    await b.open()
    try:
        for i in range(110):
            if call == "kv_add":  # one statement, no transaction around it
                assert await b.kv_add(f"k{i}", b"x" * 100)
            else:
                await b.kv_set({f"k{i}": b"x" * 100})
        # the 110th write sent a checkpoint, after every write: wait for it
        await b._run(lambda: None)
        await b.kv_set({"last": b"x"})  # a WAL copied back whole starts over here
        # the quick connection never checkpoints itself: without the broker
        # thread's checkpoints every one of the 111 commits' frames would be
        # in the WAL still
        busy, frames, _ = _wal_frames(tmp_path / "q.db")
        assert busy == 0
        assert 0 < frames < 10
    finally:
        await b.close()


def _wal_frames(path: Path) -> tuple[int, int, int]:
    """(busy, frames in the WAL, frames copied back) from another connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(busy), int(frames), int(done)
    finally:
        conn.close()
