"""The job's path in memory: enqueue, fetch, settle, rescue, and events
(the seam's transport).

An idle fetch waits on a future of its own loop, registered in the store;
whatever makes a job ready wakes every waiter (``Store.wake``), from any
thread, and each claims again.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ...errors import LeaseExpired
from ...message import ErrorRecord, Message, encode_checked, uuid7
from ...state import State
from .. import capacity
from ..base import Broker
from ..finished import compacted, compacts
from ..types import Binding, DeadLetter, Delivery, Rescued, delivery_of, events_page
from .store import Row, Store

#: header "unique" -> the states in which a key's holder blocks a new job with that key
_RETAINED = frozenset(State)
_UNIQUE_BLOCKS = {
    "active": frozenset({State.SCHEDULED, State.READY, State.RETRYING, State.RUNNING}),
    "queued": frozenset({State.SCHEDULED, State.READY, State.RETRYING}),
}


#: the states that count against a bounded queue's ``max_ready``
_WAITING = frozenset({State.SCHEDULED, State.READY, State.RETRYING})


class Transport(Broker):
    """The seam's transport methods in memory (mixed into ``MemoryBroker``)."""

    store: Store
    #: seconds finished jobs without a kept result stay visible
    retention: float

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        return self.enqueue_sync(msgs)

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        msgs = list(msgs)
        for m in msgs:  # the size check every broker makes, before storing any
            encode_checked(m, self.max_message_size)
        with self.store.lock:
            return self._add(msgs, time.time())

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        """Count and store under the store's lock: one step for every thread."""
        msgs = list(msgs)
        for m in msgs:
            encode_checked(m, self.max_message_size)
        adding = capacity.per_queue(msgs, max_ready)
        with self.store.lock:
            counts = Counter(
                r.msg.queue
                for r in self.store.rows.values()
                if r.msg.queue in adding and r.state in _WAITING
            )
            capacity.admit(adding, counts, max_ready)
            return self._add(msgs, time.time())

    def _add(self, msgs: list[Message], now: float) -> list[str]:
        """Store jobs (lock held); the ids, the existing one for a duplicate."""
        s = self.store
        ids: list[str] = []
        woke = False
        for m in msgs:
            if m.id in s.rows:
                ids.append(m.id)
                continue
            if m.key is not None and m.kind == "task" and m.key in s.keys:
                holder = s.rows[s.keys[m.key]]
                if holder.info().state not in _UNIQUE_BLOCKS.get(
                    m.headers.get("unique", ""), _RETAINED
                ):
                    # its key no longer blocks: free it (the old job keeps
                    # its message's key, which key searches still match)
                    del s.keys[m.key]
                else:
                    ids.append(s.keys[m.key])
                    continue
            m = m.copy()
            s.queues.add(m.queue)
            row = Row(msg=m, state=State.READY, run_at=now, updated_at=now)
            s.rows[m.id] = row
            if m.key is not None and m.kind == "task":
                s.keys[m.key] = m.id
            if m.eta is not None and m.eta > now:
                row.run_at = m.eta
                self.store.schedule(row)
            else:
                self.store.make_ready(row, now)
                woke = True
            ids.append(m.id)
        if woke:
            self.store.wake()
        return ids

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        with self.store.lock:
            self.store.queues.update(queues)
            for b in bindings:
                self.store.bindings[(b.pattern, b.queue)] = b

    async def publish(self, msgs: Iterable[Message]) -> int:
        return self.publish_sync(msgs)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        msgs = list(msgs)
        for m in msgs:
            encode_checked(m, self.max_message_size)
        now = time.time()
        s = self.store
        with s.lock:
            deliveries: list[Message] = []
            for m in msgs:
                if m.id in s.events:
                    continue
                s.events[m.id] = (m.copy(), now)
                deliveries += [
                    delivery_of(m, b, uuid7()) for b in s.bindings.values() if b.pattern == m.name
                ]
            self._add(deliveries, now)
            return len(deliveries)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        with self.store.lock:
            logged = [(at, m) for m, at in self.store.events.values() if m.name == event_type]
        page, next_cursor = events_page(logged, since, until, cursor, limit)
        return [m.copy() for m in page], next_cursor

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        deadline = time.monotonic() + wait
        loop = asyncio.get_running_loop()
        while True:
            s = self.store
            with s.lock:
                out = self._claim(queues, limit, lease, worker)
                if out or wait <= 0:
                    return out
                fut: asyncio.Future[None] = loop.create_future()
                entry = (loop, fut)
                s.waiters.add(entry)
                next_due = s.scheduled[0][0] - time.time() if s.scheduled else None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                with s.lock:
                    s.waiters.discard(entry)
                return []
            timeout = remaining if next_due is None else max(0.0, min(remaining, next_due))
            try:
                await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                pass
            finally:
                with s.lock:
                    s.waiters.discard(entry)

    def _claim(
        self, queues: Sequence[str], limit: int, lease: float, worker: str
    ) -> list[Delivery]:
        now = time.time()
        s = self.store
        self.store.promote(now)
        out: list[Delivery] = []
        for q in queues:
            if q in s.paused:
                continue
            heap = s.ready.get(q)
            while heap and len(out) < limit:
                _, _, _, id_, gen = heapq.heappop(heap)
                row = s.rows.get(id_)
                if row is None or row.gen != gen or row.state is not State.READY:
                    continue
                row.state = State.RUNNING
                row.msg.attempt += 1
                row.token = next(s.tokens)
                row.lease_until = now + lease
                row.worker = worker
                row.updated_at = now
                out.append(
                    Delivery(
                        id=id_,
                        message=row.msg.copy(),
                        token=row.token,
                        lease_until=row.lease_until,
                        queue=q,
                    )
                )
            if len(out) >= limit:
                break
        return out

    async def ack(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self.store.lock:
            for d in ds:  # not settling(): no generator on the hot path
                row = self.store.held(d)
                if row is None:
                    continue
                row.state = State.SUCCEEDED
                row.updated_at = now
                row.result = d.result
                if compacts(d):
                    row.msg, row.compact = compacted(row.msg), True
                ttl = d.result_ttl if d.result is not None and d.result_ttl else self.retention
                row.expires_at = now + max(ttl, self.retention)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self.store.lock:
            woke = False
            for d, row in self.store.settling(ds):
                if d.error is not None:
                    row.msg.errors.append(d.error)
                row.updated_at = now
                row.run_at = max(d.retry_at, now)
                if d.retry_at > now:
                    self.store.schedule(row)
                else:
                    self.store.make_ready(row, now)
                    woke = True
            if woke:
                self.store.wake()

    async def dead(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self.store.lock:
            for d, row in self.store.settling(ds):
                if d.error is not None:
                    row.msg.errors.append(d.error)
                row.state = State.DEAD
                row.updated_at = now

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self.store.lock:
            for d, row in self.store.settling(ds):
                row.msg.attempt = max(0, row.msg.attempt - 1)
                row.updated_at = now
                if d.retry_at > now:
                    row.run_at = d.retry_at
                    self.store.schedule(row)
                else:
                    self.store.make_ready(row, now)
            self.store.wake()

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        now = time.time()
        lost: list[Delivery] = []
        with self.store.lock:
            for d in ds:
                row = self.store.held(d)
                if row is None:
                    lost.append(d)
                    continue
                row.lease_until = now + lease
                d.lease_until = row.lease_until
        return lost

    async def rescue(self) -> Rescued:
        now = time.time()
        n = 0
        dead: list[DeadLetter] = []
        with self.store.lock:
            old = now - self.event_retention
            for eid in [e for e, (_, at) in self.store.events.items() if at < old]:
                del self.store.events[eid]
            for id_, row in list(self.store.rows.items()):
                if row.expires_at is not None and row.expires_at <= now:
                    self.store.forget(id_, row)
                    continue
                if row.state is not State.RUNNING or row.lease_until > now:
                    continue
                n += 1
                err = ErrorRecord(
                    time=now,
                    type=f"dumbwaiter.errors.{LeaseExpired.__name__}",
                    message=f"lease expired: worker {row.worker or '?'} stopped "
                    f"heartbeating during attempt {row.msg.attempt}",
                    worker=row.worker or "",
                    attempt=row.msg.attempt,
                )
                row.msg.errors.append(err)
                row.updated_at = now
                if row.msg.attempt >= row.msg.max_attempts:
                    row.state = State.DEAD
                    dead.append(DeadLetter(id_, row.msg.queue, row.msg.name, err, row.msg.copy()))
                else:
                    self.store.make_ready(row, now)
            if n:
                self.store.wake()
        return Rescued(n, dead)
