"""Looking at and acting on stored jobs in memory (the seam's admin part)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ...state import State
from ..base import Broker
from ..types import JobFilter, JobInfo, Page, QueueStats, stats_rows
from .store import Row, Store


class Admin(Broker):
    """The seam's admin methods in memory (mixed into ``MemoryBroker``)."""

    store: Store
    retention: float

    async def stats(self) -> list[QueueStats]:
        now = time.time()
        with self.store.lock:
            counts: dict[str, dict[str, float]] = {q: {} for q in self.store.queues}
            for row in self.store.rows.values():
                c = counts.setdefault(row.msg.queue, {})
                state = row.info().state if row.state is State.SCHEDULED else row.state
                c[state.value] = c.get(state.value, 0) + 1
                if row.state is State.READY:
                    c["lag"] = max(c.get("lag", 0.0), now - row.run_at)
            paused = set(self.store.paused)
        return stats_rows(counts, paused)

    def _matching(self, filter: JobFilter) -> list[tuple[str, Row]]:
        return [(i, r) for i, r in self.store.rows.items() if filter.matches(r.info())]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        with self.store.lock:
            rows = sorted(self._matching(filter), key=lambda ir: ir[0], reverse=True)
            if cursor is not None:
                rows = [ir for ir in rows if ir[0] < cursor]
            page = [r.info() for _, r in rows[:limit]]
        more = len(rows) > limit
        return Page(items=page, cursor=page[-1].message.id if more and page else None)

    async def get(self, id: str) -> JobInfo | None:
        with self.store.lock:
            row = self.store.rows.get(id)
            return None if row is None else row.info()

    async def replay(self, filter: JobFilter) -> int:
        now = time.time()
        n = 0
        with self.store.lock:
            for _, row in self._matching(filter):
                if row.state is not State.DEAD:
                    continue
                row.msg.attempt = 0
                row.replays += 1
                row.updated_at = now
                self.store.make_ready(row, now)
                n += 1
            if n:
                self.store.wake()
        return n

    async def purge(self, filter: JobFilter) -> int:
        n = 0
        with self.store.lock:
            for id_, row in self._matching(filter):
                if row.state is State.RUNNING:
                    continue
                self.store.forget(id_, row)
                n += 1
        return n

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        now = time.time()
        out: list[str] = []
        with self.store.lock:
            for id_, row in self.store.cancellable(ids):
                row.state = State.CANCELLED
                row.gen += 1
                row.updated_at = now
                row.expires_at = now + self.retention
                out.append(id_)
        return out

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        now = time.time()
        out: list[str] = []
        with self.store.lock:
            for id_, row in self.store.cancellable(ids):
                row.run_at = at
                row.updated_at = now
                if at > now:
                    self.store.schedule(row)
                else:
                    self.store.make_ready(row, now)
                    self.store.wake()
                out.append(id_)
        return out

    async def pause(self, queue: str) -> None:
        with self.store.lock:
            self.store.paused.add(queue)
            self.store.queues.add(queue)

    async def resume(self, queue: str) -> None:
        with self.store.lock:
            self.store.paused.discard(queue)
            self.store.wake()
