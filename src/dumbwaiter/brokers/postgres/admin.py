"""The PostgreSQL broker's admin calls: stats, listings, replay, purge, cancel.

They read and change ``dw_jobs`` for the CLI and the dashboard, on the
durable pool (their changes are flushed before they return).  A filter's
conditions come from the builder both SQL engines share (sql/filters.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from ..sql.filters import POSTGRES, where
from ..sql.rows import info_row, is_uuid, jobs_page
from ..types import JobFilter, JobInfo, Page, QueueStats, stats_rows
from .connection import PostgresConnection


class PostgresAdmin(PostgresConnection):
    """Admin: what the CLI and the dashboard read and change."""

    async def stats(self) -> list[QueueStats]:
        async def run(c: psycopg.AsyncConnection[Any]) -> list[QueueStats]:
            await c.execute(self.q.fold_counts)  # keeps the deltas to read few
            async with c.transaction():
                # the lags' recursive probes are estimated far above what they
                # cost: without this, JIT compiles them for most of a second
                await c.execute(b"SET LOCAL jit = off")
                queues = await (await c.execute(self.q.queues)).fetchall()
                counts = await (await c.execute(self.q.counts)).fetchall()
                lags = await (await c.execute(self.q.lags)).fetchall()
            return _stats(queues, counts, lags)

        return await self._run(run)

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        conds, params = where(filter, POSTGRES)
        if cursor is not None:
            conds += " AND id < %s::uuid"
            params.append(cursor)
        query = (self.q.list_prefix + conds + self.q.list_suffix).encode()
        params.append(limit + 1)

        async def run(c: psycopg.AsyncConnection[Any]) -> list[Any]:
            return await (await c.execute(query, params)).fetchall()

        rows = await self._run(run)
        return jobs_page(rows, limit)

    async def get(self, id: str) -> JobInfo | None:
        try:
            uuid.UUID(id)
        except ValueError:
            return None

        async def run(c: psycopg.AsyncConnection[Any]) -> Any:
            return await (await c.execute(self.q.get, (id,))).fetchone()

        row = await self._run(run)
        return None if row is None else info_row(row)

    async def replay(self, filter: JobFilter) -> int:
        conds, params = where(filter, POSTGRES)
        query = (self.q.replay_prefix + conds + self.q.replay_suffix).encode()
        params = [*params, self.q.channel]
        query = query.replace(b"%(channel)s", b"%s")

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(query, params)).fetchone()
            return int(row[0]) if row else 0

        return await self._run(run)

    async def purge(self, filter: JobFilter) -> int:
        conds, params = where(filter, POSTGRES)
        query = (self.q.purge_prefix + conds).encode()

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            return (await c.execute(query, params)).rowcount

        return await self._run(run)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        valid = [i for i in ids if is_uuid(i)]
        if not valid:
            return []

        async def run(c: psycopg.AsyncConnection[Any]) -> list[str]:
            cur = await c.execute(self.q.cancel, (self.retention, valid))
            return [r[0] for r in await cur.fetchall()]

        return await self._run(run)

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        valid = [i for i in ids if is_uuid(i)]
        if not valid:
            return []
        await self._read_clock()
        params = {"ids": valid, "at": self.clock.to_server(at), "channel": self.q.channel}

        async def run(c: psycopg.AsyncConnection[Any]) -> list[str]:
            cur = await c.execute(self.q.reschedule, params)
            return [r[0] for r in await cur.fetchall()]

        return await self._run(run)

    async def pause(self, queue: str) -> None:
        await self._set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        await self._set_paused(queue, False)

    async def _set_paused(self, queue: str, paused: bool) -> None:
        params = {"queue": queue, "paused": paused, "channel": self.q.channel}
        await self._run(lambda c: c.execute(self.q.set_paused, params))
        self._known_queues.add(queue)


def _stats(queues: list[Any], counts: list[Any], lags: list[Any]) -> list[QueueStats]:
    """Rows of ``dw_queues``, of the counts (queue, state, n; a retrying job
    has the state ``retrying``) and of the lags (queue, seconds)."""
    table: dict[str, dict[str, float]] = {name: {} for name, _ in queues}
    paused = {name for name, p in queues if p}
    for queue, state, n in counts:
        if n:
            c = table.setdefault(queue, {})
            c[state] = c.get(state, 0) + n
    for queue, age in lags:
        table.setdefault(queue, {})["lag"] = float(age)
    return stats_rows(table, paused)
