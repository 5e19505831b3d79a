"""What a ``memory://`` URL names: the jobs, their queues, locks, kv and
limits of one app, in this process, behind one lock.

The store also keeps the moves of the job state machine that several seam
calls share (a job made ready, scheduled, forgotten; due jobs promoted;
idle fetches woken), so the transport and the admin part apply them alike.
Every method here expects the caller to hold ``lock``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ...message import Message
from ...state import CANCELLABLE_STATES, State
from ..types import Binding, Delivery, JobInfo


@dataclass(slots=True)
class Row:
    """One job: its message and where it stands."""

    msg: Message
    state: State
    run_at: float
    updated_at: float
    token: int = 0
    #: bumped at each move, so a stale entry of a ready or scheduled heap
    #: (the job moved on since) is skipped when popped
    gen: int = 0
    lease_until: float = 0.0
    worker: str | None = None
    result: bytes | None = None
    expires_at: float | None = None
    replays: int = 0
    #: only a compact record is kept (finished.py)
    compact: bool = False

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
            compact=self.compact,
        )


@dataclass(slots=True)
class Lock:
    owner: str
    token: int
    expires: float


@dataclass
class Store:
    """Everything a ``memory://NAME`` URL names; shared by brokers with the same name."""

    rows: dict[str, Row] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    ready: dict[str, list[tuple[int, float, int, str, int]]] = field(default_factory=dict)
    scheduled: list[tuple[float, int, str, int]] = field(default_factory=list)
    queues: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    locks: dict[str, Lock] = field(default_factory=dict)
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
    #: ties in the heaps, in insertion order
    seq: itertools.count[int] = field(default_factory=itertools.count)
    #: lease tokens, one sequence per store (so brokers sharing it never
    #: hand out the same token)
    tokens: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def make_ready(self, row: Row, at: float) -> None:
        row.state = State.READY
        row.run_at = at
        row.gen += 1
        heap = self.ready.setdefault(row.msg.queue, [])
        heapq.heappush(heap, (-row.msg.priority, at, next(self.seq), row.msg.id, row.gen))

    def schedule(self, row: Row) -> None:
        row.state = State.SCHEDULED
        row.gen += 1
        heapq.heappush(self.scheduled, (row.run_at, next(self.seq), row.msg.id, row.gen))

    def wake(self) -> None:
        """Wake every idle fetch (each claims again)."""
        for loop, fut in list(self.waiters):
            loop.call_soon_threadsafe(_set_done, fut)
        self.waiters.clear()

    def promote(self, now: float) -> None:
        """Make the scheduled jobs that are due ready."""
        while self.scheduled and self.scheduled[0][0] <= now:
            _, _, id_, gen = heapq.heappop(self.scheduled)
            row = self.rows.get(id_)
            if row is not None and row.gen == gen and row.state is State.SCHEDULED:
                self.make_ready(row, row.run_at)

    def held(self, d: Delivery) -> Row | None:
        """The job ``d`` leases, if its lease is still the one it holds."""
        row = self.rows.get(d.id)
        if row is None or row.state is not State.RUNNING or row.token != d.token:
            return None
        return row

    def settling(self, ds: Sequence[Delivery]) -> Iterator[tuple[Delivery, Row]]:
        """Each of ``ds`` whose lease still holds, with its job; the others
        are passed by (the seam ignores an outcome from a lost lease)."""
        for d in ds:
            row = self.held(d)
            if row is not None:
                yield d, row

    def cancellable(self, ids: Sequence[str]) -> Iterator[tuple[str, Row]]:
        """Each of ``ids`` whose job is waiting (``CANCELLABLE_STATES``)."""
        for id_ in ids:
            row = self.rows.get(id_)
            if row is not None and row.info().state in CANCELLABLE_STATES:
                yield id_, row

    def forget(self, id_: str, row: Row) -> None:
        """Delete a job, and its unique key if it still holds it."""
        del self.rows[id_]
        if row.msg.key is not None and self.keys.get(row.msg.key) == id_:
            del self.keys[row.msg.key]

    def kv_live(self, key: str, now: float) -> bytes | None:
        """A kv entry's value, or None (an expired one is deleted)."""
        entry = self.kv.get(key)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self.kv[key]
            return None
        return entry[0]


_named: dict[str, Store] = {}
_named_lock = threading.Lock()


def named(name: str) -> Store:
    """The store of ``memory://NAME``, made on first use (one per process)."""
    with _named_lock:
        return _named.setdefault(name, Store())


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
