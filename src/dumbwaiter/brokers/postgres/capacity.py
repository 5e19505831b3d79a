"""Bounded queues on PostgreSQL: the count and the insert in one transaction.

The producers of a bounded queue take a transaction-scoped advisory lock per
queue (in name order, so two producers never wait for each other), count
the queue's waiting jobs from the exact counters (``dw_counts`` plus the
deltas the triggers wrote), and insert.  The lock is released at commit,
when the rows are visible to the next producer's count: the bound holds for
every process on every host, with no lock row of our own to clean up after
a crash.  Batches of any size take the few-rows insert here (no ``COPY``):
a bounded queue is small by definition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from ...message import Message
from .. import capacity
from .enqueue import PostgresEnqueue


class PostgresCapacity(PostgresEnqueue):
    """``enqueue_bounded`` (mixed into ``PostgresBroker``)."""

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        adding = capacity.per_queue(msgs, max_ready)
        if not adding:
            return await self.enqueue(msgs)
        await self._read_clock()
        rows = [self._row(m) for m in msgs]
        queues = sorted(adding)

        async def run(c: psycopg.AsyncConnection[Any]) -> list[str]:
            async with c.transaction():
                await c.execute(self.q.capacity_lock, (f"dw:{self.q.schema}:", queues))
                counts = await (await c.execute(self.q.waiting, (queues,))).fetchall()
                capacity.admit(adding, dict(counts), max_ready)
                return await self._ainsert(c, rows)

        return await self._aretrying(run)
