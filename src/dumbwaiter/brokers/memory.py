"""``memory://``: the reference broker, kept in one process's memory.

It is the executable statement of the seam's rules (tests/conformance runs
it like every other broker) and the fast broker for unit tests of the layers
above the seam.  Nothing survives the process, so it is never a production
choice.  It is thread-safe: sync producers in other threads may enqueue while
a worker's event loop fetches.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar
from urllib.parse import urlsplit

import orjson

from ..errors import LeaseExpired
from ..flow import window_wait
from ..message import ErrorRecord, Message, encode_checked, uuid7
from ..state import CANCELLABLE_STATES, State
from . import urlopts
from .base import (
    Binding,
    Broker,
    Capabilities,
    DeadLetter,
    Delivery,
    JobFilter,
    JobInfo,
    KvWrite,
    Page,
    QueueStats,
    Rescued,
    delivery_of,
    kv_write,
    stats_rows,
)

T = TypeVar("T")

#: header "unique" -> the states in which a key's holder blocks a new job with that key
_RETAINED = frozenset(State)
_UNIQUE_BLOCKS = {
    "active": frozenset({State.SCHEDULED, State.READY, State.RETRYING, State.RUNNING}),
    "queued": frozenset({State.SCHEDULED, State.READY, State.RETRYING}),
}

#: finished jobs without a kept result stay visible this long (seconds)
DEFAULT_RETENTION = 3600.0


@dataclass(slots=True)
class _Row:
    msg: Message
    state: State
    run_at: float
    updated_at: float
    token: int = 0
    gen: int = 0
    lease_until: float = 0.0
    worker: str | None = None
    result: bytes | None = None
    expires_at: float | None = None
    replays: int = 0

    def info(self) -> JobInfo:
        state = self.state
        if state is State.SCHEDULED and self.msg.attempt > 0:
            state = State.RETRYING
        return JobInfo(
            message=self.msg.copy(),
            state=state,
            run_at=self.run_at,
            updated_at=self.updated_at,
            worker=self.worker,
            lease_until=self.lease_until if self.state is State.RUNNING else None,
            result=self.result,
            replays=self.replays,
        )


@dataclass(slots=True)
class _Lock:
    owner: str
    token: int
    expires: float


@dataclass
class _Store:
    """Everything a ``memory://NAME`` URL names; shared by brokers with the same name."""

    rows: dict[str, _Row] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    ready: dict[str, list[tuple[int, float, int, str, int]]] = field(default_factory=dict)
    scheduled: list[tuple[float, int, str, int]] = field(default_factory=list)
    queues: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    locks: dict[str, _Lock] = field(default_factory=dict)
    kv: dict[str, tuple[bytes, float | None]] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    slots: dict[str, dict[str, float]] = field(default_factory=dict)
    bindings: dict[tuple[str, str], Binding] = field(default_factory=dict)
    events: dict[str, tuple[Message, float]] = field(default_factory=dict)
    fence: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(
        default_factory=set
    )


RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs stay visible")
OPTIONS = urlopts.Table("memory", [RETENTION], check_hosts=False)


class MemoryBroker(Broker):
    """In-process broker.  ``memory://`` is private to one broker object;
    ``memory://NAME`` is shared by every broker of that name in the process.
    ``?retention=SECONDS`` is its one option (the ``retention`` argument wins)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True, multi_process=False, events=True, limits=True
    )
    schemes: ClassVar[tuple[str, ...]] = ("memory",)
    _named: ClassVar[dict[str, _Store]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str = "memory://", retention: float | None = None) -> None:
        super().__init__(url)
        opts = OPTIONS.parse(url)
        parts = urlsplit(url)
        name = parts.netloc + parts.path
        if name:
            with self._named_lock:
                self._s = self._named.setdefault(name, _Store())
        else:
            self._s = _Store()
        self.retention = opts[RETENTION] if retention is None else retention
        self._seq = itertools.count()
        self._tokens = itertools.count(1)

    # -- transport -------------------------------------------------------

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
        with self._s.lock:
            return self._store(msgs, time.time())

    def _store(self, msgs: list[Message], now: float) -> list[str]:
        """Store jobs (lock held); the ids, the existing one for a duplicate."""
        s = self._s
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
            row = _Row(msg=m, state=State.READY, run_at=now, updated_at=now)
            s.rows[m.id] = row
            if m.key is not None and m.kind == "task":
                s.keys[m.key] = m.id
            if m.eta is not None and m.eta > now:
                row.run_at = m.eta
                self._schedule(row)
            else:
                self._make_ready(row, now)
                woke = True
            ids.append(m.id)
        if woke:
            self._wake()
        return ids

    # -- events ------------------------------------------------------------------

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        with self._s.lock:
            self._s.queues.update(queues)
            for b in bindings:
                self._s.bindings[(b.pattern, b.queue)] = b

    async def publish(self, msgs: Iterable[Message]) -> int:
        return self.publish_sync(msgs)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        msgs = list(msgs)
        for m in msgs:
            encode_checked(m, self.max_message_size)
        now = time.time()
        s = self._s
        with s.lock:
            deliveries: list[Message] = []
            for m in msgs:
                if m.id in s.events:
                    continue
                s.events[m.id] = (m.copy(), now)
                deliveries += [
                    delivery_of(m, b, uuid7()) for b in s.bindings.values() if b.pattern == m.name
                ]
            self._store(deliveries, now)
            return len(deliveries)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        with self._s.lock:
            found = sorted(
                (m for m, at in self._s.events.values()
                 if m.name == event_type
                 and (since is None or at >= since)
                 and (until is None or at <= until)
                 and (cursor is None or m.id > cursor)),
                key=lambda m: m.id,
            )  # fmt: skip
        page = [m.copy() for m in found[:limit]]
        return page, (page[-1].id if len(found) > limit else None)

    def _make_ready(self, row: _Row, at: float) -> None:
        row.state = State.READY
        row.run_at = at
        row.gen += 1
        heap = self._s.ready.setdefault(row.msg.queue, [])
        heapq.heappush(heap, (-row.msg.priority, at, next(self._seq), row.msg.id, row.gen))

    def _schedule(self, row: _Row) -> None:
        row.state = State.SCHEDULED
        row.gen += 1
        heapq.heappush(self._s.scheduled, (row.run_at, next(self._seq), row.msg.id, row.gen))

    def _wake(self) -> None:
        for loop, fut in list(self._s.waiters):
            loop.call_soon_threadsafe(_set_done, fut)
        self._s.waiters.clear()

    def _promote(self, now: float) -> None:
        s = self._s
        while s.scheduled and s.scheduled[0][0] <= now:
            _, _, id_, gen = heapq.heappop(s.scheduled)
            row = s.rows.get(id_)
            if row is not None and row.gen == gen and row.state is State.SCHEDULED:
                self._make_ready(row, row.run_at)

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        deadline = time.monotonic() + wait
        loop = asyncio.get_running_loop()
        while True:
            s = self._s
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
        s = self._s
        self._promote(now)
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
                row.token = next(self._tokens)
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

    def _held(self, d: Delivery) -> _Row | None:
        row = self._s.rows.get(d.id)
        if row is None or row.state is not State.RUNNING or row.token != d.token:
            return None
        return row

    async def ack(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self._s.lock:
            for d in ds:
                row = self._held(d)
                if row is None:
                    continue
                row.state = State.SUCCEEDED
                row.updated_at = now
                row.result = d.result
                ttl = d.result_ttl if d.result is not None and d.result_ttl else self.retention
                row.expires_at = now + max(ttl, self.retention)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self._s.lock:
            woke = False
            for d in ds:
                row = self._held(d)
                if row is None:
                    continue
                if d.error is not None:
                    row.msg.errors.append(d.error)
                row.updated_at = now
                row.run_at = max(d.retry_at, now)
                if d.retry_at > now:
                    self._schedule(row)
                else:
                    self._make_ready(row, now)
                    woke = True
            if woke:
                self._wake()

    async def dead(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self._s.lock:
            for d in ds:
                row = self._held(d)
                if row is None:
                    continue
                if d.error is not None:
                    row.msg.errors.append(d.error)
                row.state = State.DEAD
                row.updated_at = now

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        with self._s.lock:
            for d in ds:
                row = self._held(d)
                if row is None:
                    continue
                row.msg.attempt = max(0, row.msg.attempt - 1)
                row.updated_at = now
                if d.retry_at > now:
                    row.run_at = d.retry_at
                    self._schedule(row)
                else:
                    self._make_ready(row, now)
            self._wake()

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        now = time.time()
        lost: list[Delivery] = []
        with self._s.lock:
            for d in ds:
                row = self._held(d)
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
        with self._s.lock:
            old = now - self.event_retention
            for eid in [e for e, (_, at) in self._s.events.items() if at < old]:
                del self._s.events[eid]
            for id_, row in list(self._s.rows.items()):
                if row.expires_at is not None and row.expires_at <= now:
                    self._forget(id_, row)
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
                    self._make_ready(row, now)
            if n:
                self._wake()
        return Rescued(n, dead)

    def _forget(self, id_: str, row: _Row) -> None:
        del self._s.rows[id_]
        if row.msg.key is not None and self._s.keys.get(row.msg.key) == id_:
            del self._s.keys[row.msg.key]

    # -- admin -----------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        now = time.time()
        with self._s.lock:
            counts: dict[str, dict[str, float]] = {q: {} for q in self._s.queues}
            for row in self._s.rows.values():
                c = counts.setdefault(row.msg.queue, {})
                state = row.info().state if row.state is State.SCHEDULED else row.state
                c[state.value] = c.get(state.value, 0) + 1
                if row.state is State.READY:
                    c["lag"] = max(c.get("lag", 0.0), now - row.run_at)
            paused = set(self._s.paused)
        return stats_rows(counts, paused)

    def _matching(self, filter: JobFilter) -> list[tuple[str, _Row]]:
        return [(i, r) for i, r in self._s.rows.items() if filter.matches(r.info())]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        with self._s.lock:
            rows = sorted(self._matching(filter), key=lambda ir: ir[0], reverse=True)
            if cursor is not None:
                rows = [ir for ir in rows if ir[0] < cursor]
            page = [r.info() for _, r in rows[:limit]]
        more = len(rows) > limit
        return Page(items=page, cursor=page[-1].message.id if more and page else None)

    async def get(self, id: str) -> JobInfo | None:
        with self._s.lock:
            row = self._s.rows.get(id)
            return None if row is None else row.info()

    async def replay(self, filter: JobFilter) -> int:
        now = time.time()
        n = 0
        with self._s.lock:
            for _, row in self._matching(filter):
                if row.state is not State.DEAD:
                    continue
                row.msg.attempt = 0
                row.replays += 1
                row.updated_at = now
                self._make_ready(row, now)
                n += 1
            if n:
                self._wake()
        return n

    async def purge(self, filter: JobFilter) -> int:
        n = 0
        with self._s.lock:
            for id_, row in self._matching(filter):
                if row.state is State.RUNNING:
                    continue
                self._forget(id_, row)
                n += 1
        return n

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        now = time.time()
        out: list[str] = []
        with self._s.lock:
            for id_ in ids:
                row = self._s.rows.get(id_)
                if row is None or row.info().state not in CANCELLABLE_STATES:
                    continue
                row.state = State.CANCELLED
                row.gen += 1
                row.updated_at = now
                row.expires_at = now + self.retention
                out.append(id_)
        return out

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        now = time.time()
        out: list[str] = []
        with self._s.lock:
            for id_ in ids:
                row = self._s.rows.get(id_)
                if row is None or row.info().state not in CANCELLABLE_STATES:
                    continue
                row.run_at = at
                row.updated_at = now
                if at > now:
                    self._schedule(row)
                else:
                    self._make_ready(row, now)
                    self._wake()
                out.append(id_)
        return out

    async def pause(self, queue: str) -> None:
        with self._s.lock:
            self._s.paused.add(queue)
            self._s.queues.add(queue)

    async def resume(self, queue: str) -> None:
        with self._s.lock:
            self._s.paused.discard(queue)
            self._wake()

    # -- coordination ------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        now = time.time()
        with self._s.lock:
            held = self._s.locks.get(name)
            if held is not None and held.expires > now and held.owner != owner:
                return None
            if held is None or held.owner != owner or held.expires <= now:
                self._s.fence += 1
                held = _Lock(owner=owner, token=self._s.fence, expires=now + ttl)
                self._s.locks[name] = held
            else:
                held.expires = now + ttl
            return held.token

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = time.time()
        with self._s.lock:
            held = self._s.locks.get(name)
            if held is None or held.owner != owner or held.token != token or held.expires <= now:
                return False
            held.expires = now + ttl
            return True

    async def release(self, name: str, owner: str, token: int) -> None:
        with self._s.lock:
            held = self._s.locks.get(name)
            if held is not None and held.owner == owner and held.token == token:
                del self._s.locks[name]

    # -- key-value ---------------------------------------------------------------

    def _kv_live(self, key: str, now: float) -> bytes | None:
        entry = self._s.kv.get(key)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self._s.kv[key]
            return None
        return entry[0]

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        now = time.time()
        with self._s.lock:
            found = {k: self._kv_live(k, now) for k in keys}
        return {k: v for k, v in found.items() if v is not None}

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        expires = None if ttl is None else time.time() + ttl
        with self._s.lock:
            for k, v in items.items():
                self._s.kv[k] = (bytes(v), expires)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Under the store's lock: atomic against other threads' calls too."""
        now = time.time()
        with self._s.lock:
            found = {k: self._kv_live(k, now) for k in keys}
            writes, out = decide({k: v for k, v in found.items() if v is not None})
            for k, v in writes.items():
                data, ttl = kv_write(v)
                self._s.kv[k] = (data, None if ttl is None else now + ttl)
        return out

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        now = time.time()
        with self._s.lock:
            if self._kv_live(key, now) is not None:
                return False
            self._s.kv[key] = (bytes(value), None if ttl is None else now + ttl)
            return True

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        now = time.time()
        with self._s.lock:
            current = self._kv_live(key, now)
            expires = (
                self._s.kv[key][1] if current is not None else (None if ttl is None else now + ttl)
            )
            value = (int(current) if current is not None else 0) + amount
            self._s.kv[key] = (str(value).encode(), expires)
            return value

    async def kv_delete(self, keys: Sequence[str]) -> int:
        now = time.time()
        with self._s.lock:
            n = 0
            for k in keys:
                if self._kv_live(k, now) is not None:
                    del self._s.kv[k]
                    n += 1
            return n

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        now = time.time()
        with self._s.lock:
            raw = self._kv_live(key, now)
            members = set(orjson.loads(raw)) if raw is not None else set()
            members.add(member)
            expires = (
                self._s.kv[key][1] if raw is not None else (None if ttl is None else now + ttl)
            )
            self._s.kv[key] = (orjson.dumps(sorted(members)), expires)
            return len(members)

    async def kv_smembers(self, key: str) -> set[str]:
        with self._s.lock:
            raw = self._kv_live(key, time.time())
        return set(orjson.loads(raw)) if raw is not None else set()

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        now = time.time()
        with self._s.lock:
            keys = [k for k in self._s.kv if k.startswith(prefix)]
            found = {k: self._kv_live(k, now) for k in keys}
        return {k: v for k, v in found.items() if v is not None}

    # -- flow control ----------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        with self._s.lock:
            log = self._s.rates.setdefault(key, [])
            while log and log[0] <= at - 2 * per:  # far behind any window still open
                log.pop(0)
            wait = window_wait(log, at, rate, per)
            if wait == 0.0:
                bisect.insort(log, at)
            return wait

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        now = time.time()
        with self._s.lock:
            held = self._s.slots.setdefault(key, {})
            for h in [h for h, exp in held.items() if exp <= now]:
                del held[h]
            if holder not in held and len(held) >= limit:
                return False
            held[holder] = now + ttl
            return True

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        now = time.time()
        with self._s.lock:
            for key, holder in holds:
                held = self._s.slots.get(key, {})
                if holder in held:
                    held[holder] = now + ttl

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        with self._s.lock:
            for key, holder in holds:
                self._s.slots.get(key, {}).pop(holder, None)


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
