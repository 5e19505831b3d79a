"""The SQLite broker's admin calls: stats, listings, replay, purge, cancel.

They run on the broker's thread (reads on its connection, changes in its
write transactions).  A filter's conditions come from the builder both SQL
engines share (sql/filters.py).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

import orjson

from ..sql.filters import SQLITE, where
from ..sql.rows import info_row, jobs_page
from ..types import JobFilter, JobInfo, Page, QueueStats, stats_rows
from .connection import SQLiteConnection

_INFO_COLS = (
    "id, queue, state, attempt, body, errors, run_at, updated_at, worker,"
    " lease_until, result, replays"
)


class SQLiteAdmin(SQLiteConnection):
    """Admin: what the CLI and the dashboard read and change."""

    async def stats(self) -> list[QueueStats]:
        return await self._run(self._stats)

    def _stats(self) -> list[QueueStats]:
        c = self._worker_conn()
        now = time.time()
        counts: dict[str, dict[str, float]] = {}
        paused: set[str] = set()
        for name, is_paused in c.execute("SELECT name, paused FROM dw_queues"):
            counts[name] = {}
            if is_paused:
                paused.add(name)
        for queue, state, n in c.execute("SELECT queue, state, n FROM dw_counts"):
            counts.setdefault(queue, {})[state] = n  # kept by triggers: no row counting
        # per queue, so each min() is one probe of dw_jobs_ready_age
        for q, n in counts.items():
            if n.get("ready", 0) > 0:
                row = c.execute(
                    "SELECT min(run_at) FROM dw_jobs WHERE state='ready' AND queue=?", (q,)
                ).fetchone()
                if row[0] is not None:
                    n["lag"] = now - row[0]
        return stats_rows(counts, paused)

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        return await self._run(self._list, filter, cursor, limit)

    def _list(self, filter: JobFilter, cursor: str | None, limit: int) -> Page:
        conds, params = where(filter, SQLITE)
        if cursor is not None:
            conds += " AND id < ?"
            params.append(cursor)
        rows = (
            self._worker_conn()
            .execute(
                f"SELECT {_INFO_COLS} FROM {_jobs(filter)} WHERE {conds} ORDER BY id DESC LIMIT ?",
                [*params, limit + 1],
            )
            .fetchall()
        )
        return jobs_page(rows, limit)

    async def get(self, id: str) -> JobInfo | None:
        return await self._run(self._get, id)

    def _get(self, id: str) -> JobInfo | None:
        row = (
            self._worker_conn()
            .execute(f"SELECT {_INFO_COLS} FROM dw_jobs WHERE id=?", (id,))
            .fetchone()
        )
        return None if row is None else info_row(row)

    def get_sync(self, id: str) -> JobInfo | None:
        """``get`` for sync callers (``Job.status()`` from a request handler)."""
        row = self._sync_conn().execute(f"SELECT {_INFO_COLS} FROM dw_jobs WHERE id=?", (id,))
        r = row.fetchone()
        return None if r is None else info_row(r)

    async def replay(self, filter: JobFilter) -> int:
        return await self._run(self._replay, filter)

    def _replay(self, filter: JobFilter) -> int:
        conds, params = where(filter, SQLITE)
        now = time.time()
        return self._wtx(
            lambda c: (
                c.execute(
                    f"UPDATE {_jobs(filter)} SET state='ready', attempt=0, run_at=?,"
                    " updated_at=?, replays=replays+1, expires_at=NULL"
                    f" WHERE state='dead' AND {conds}",
                    [now, now, *params],
                ).rowcount
            )
        )

    async def purge(self, filter: JobFilter) -> int:
        return await self._run(self._purge, filter)

    def _purge(self, filter: JobFilter) -> int:
        conds, params = where(filter, SQLITE)
        return self._wtx(
            lambda c: (
                c.execute(
                    f"DELETE FROM {_jobs(filter)} WHERE state!='running' AND {conds}", params
                ).rowcount
            )
        )

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        return await self._run(self._cancel, list(ids))

    def _cancel(self, ids: list[str]) -> list[str]:
        now = time.time()
        return self._wtx(
            lambda c: [
                r[0]
                for r in c.execute(
                    "UPDATE dw_jobs SET state='cancelled', updated_at=?, expires_at=?"
                    " WHERE id IN (SELECT value FROM json_each(?))"
                    " AND state IN ('scheduled', 'ready') RETURNING id",
                    (now, now + self.retention, orjson.dumps(ids)),
                ).fetchall()
            ]
        )

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        def run(c: sqlite3.Connection) -> list[str]:
            now = time.time()
            return [
                r[0]
                for r in c.execute(
                    "UPDATE dw_jobs SET state=CASE WHEN ?1 > ?2 THEN 'scheduled' ELSE 'ready' END,"
                    " run_at=max(?1, ?2), updated_at=?2"
                    " WHERE id IN (SELECT value FROM json_each(?3))"
                    " AND state IN ('scheduled', 'ready') RETURNING id",
                    (at, now, orjson.dumps(list(ids))),
                ).fetchall()
            ]

        return await self._run(self._wtx, run)

    async def pause(self, queue: str) -> None:
        await self._run(self._set_paused, queue, 1)

    async def resume(self, queue: str) -> None:
        await self._run(self._set_paused, queue, 0)

    def _set_paused(self, queue: str, paused: int) -> None:
        self._wtx(
            lambda c: c.execute(
                "INSERT INTO dw_queues (name, paused) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET paused=excluded.paused",
                (queue, paused),
            )
        )


def _jobs(f: JobFilter) -> str:
    """The table an admin statement reads: by the key index when the filter has
    a key.  SQLite plans without statistics (nothing runs ANALYZE), and its
    default guesses rate an equality on two columns of (queue, state, id)
    above one on msg_key, so a key search within a queue and state would read
    that whole (queue, state) range; a key selects few jobs, so its index is
    always the one to read."""
    return "dw_jobs INDEXED BY dw_jobs_msg_key" if f.key is not None else "dw_jobs"
