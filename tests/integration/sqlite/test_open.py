"""Opening a SQLite broker while another process holds the file.

A worker and its schedulers start together on one new file; SQLite answers
the switch to WAL mode that meets another connection's lock with "database
is locked" at once, without waiting for the busy timeout.  The broker must
wait for the lock like any other statement does.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from dumbwaiter.brokers import from_url


def test_open_waits_for_a_lock_held_while_the_file_turns_to_wal(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")  # a file in rollback-journal mode, as sqlite3 makes it
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")  # a writer: SQLite refuses the switch at once
    released = threading.Timer(0.3, holder.execute, ("COMMIT",))
    released.start()
    broker = from_url(f"sqlite:///{path}?busy_timeout=30")

    async def main() -> None:
        await broker.open()
        await broker.close()

    try:
        asyncio.run(main())
    finally:
        released.join()
        holder.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    check.close()
