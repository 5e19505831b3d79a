"""An app on Redis as keyspaces: the seam's calls sent to the keyspace of
the queue they concern (``layout.py`` says which keys live where).

With ``layout=app`` there is one keyspace, the home one, and every call goes
straight to it.  With ``layout=queues`` a call about jobs of one queue goes
to that queue's keyspace (on a cluster, the primary that owns its slot);
calls about several queues go to each keyspace concerned, concurrently where
they are independent; admin calls that do not name a queue (``stats``, a
``get`` by id) ask every keyspace of the app, found through the home list
of queues (``{dw:NAME}:spaces``, which each process adds a queue to the
first time it uses it).  Locks, the key-value store, limits and events are
the home keyspace's (``StateDelegation`` forwards them).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import ClassVar, TypeVar

from ...errors import BrokerError
from ...message import Message
from ..base import StateDelegation
from ..types import Binding, Capabilities, Delivery, JobFilter, JobInfo, Page, QueueStats, Rescued
from . import layout
from .connection import Connection
from .keyspace import Keyspace
from .lua import Scripts

T = TypeVar("T")
#: separates a queue's name from its keyspace's own cursor in a list cursor
_CURSOR_SEP = "\x1f"
#: a keyspace and the positions of its messages in an enqueue
Group = tuple[Keyspace, list[int]]
Waiting = asyncio.Future[list[Delivery]]
#: the job path's methods: with one keyspace, the home one's, once checked
_DIRECT = (
    "enqueue",
    "enqueue_sync",
    "publish",
    "publish_sync",
    "fetch",
    "ack",
    "retry",
    "dead",
    "requeue",
    "extend",
    "cancel_running",
)


class Router(StateDelegation):
    """The seam on an app's keyspaces (mixed into ``RedisBroker``)."""

    # what each keyspace offers, the app offers
    capabilities: ClassVar[Capabilities] = Keyspace.capabilities
    client_errors: ClassVar[tuple[type[BaseException], ...]] = Keyspace.client_errors

    def __init__(self, url: str, name: str, wanted: str, make: Callable[[str], Keyspace]) -> None:
        self._make = make
        self._name = name
        #: ``layout.APP`` or ``layout.QUEUES`` (the URL's ``layout=``)
        self.layout = wanted
        self._single = wanted == layout.APP
        #: the app's home keyspace, ``{dw:NAME}``
        self.home = make(name)
        self.state = self.home
        self._spaces: dict[str, Keyspace] = {}
        #: queues this process has added to the home list
        self._known: set[str] = set()
        self._checked = False
        self._registry = f"{self.home.prefix}:spaces"
        super().__init__(url)

    def __repr__(self) -> str:
        return f"<RedisBroker {self.prefix} layout={self.layout}>"

    # -- what the App sets, and what tests and tools read ------------------------

    @property
    def max_message_size(self) -> int | None:
        return self.home.max_message_size

    @max_message_size.setter
    def max_message_size(self, value: int | None) -> None:
        for ks in self._local():
            ks.max_message_size = value

    @property
    def event_retention(self) -> float:
        return self.home.event_retention

    @event_retention.setter
    def event_retention(self, value: float) -> None:
        for ks in self._local():
            ks.event_retention = value

    @property
    def conn(self) -> Connection:
        """The home keyspace's connection."""
        return self.home.conn

    @property
    def lua(self) -> Scripts:
        return self.home.lua

    @property
    def prefix(self) -> str:
        """The home keyspace's hash tag, ``{dw:NAME}``."""
        return self.home.prefix

    @property
    def retention(self) -> float:
        return self.home.retention

    def failure(
        self, exc: BaseException, what: str = "", waited: float | None = None
    ) -> BrokerError:
        return self.home.failure(exc, what, waited)

    async def server_time(self) -> float | None:
        return await self.home.server_time()

    # -- keyspaces ----------------------------------------------------------------

    def keyspace(self, queue: str) -> Keyspace:
        """The keyspace that holds ``queue``'s jobs."""
        if self._single or queue.startswith(layout.HOME_PREFIX):
            return self.home
        ks = self._spaces.get(queue)
        if ks is None:
            ks = self._make(layout.keyspace_name(self._name, queue))
            ks.max_message_size = self.home.max_message_size
            ks.event_retention = self.home.event_retention
            self._spaces[queue] = ks
        return ks

    def _local(self) -> list[Keyspace]:
        return [self.home, *self._spaces.values()]

    def _new(self, queues: Iterable[str]) -> list[str]:
        """Queues with a keyspace of their own not yet in the home list."""
        if self._single:
            return []
        out = {q for q in queues if q not in self._known and self.keyspace(q) is not self.home}
        return sorted(out)

    async def _ready(self, queues: Iterable[str] = ()) -> None:
        """Check the layout once per process; list new queues' keyspaces."""
        if not self._checked:
            await layout.check(self.home.conn.links.get(), self.url, self.prefix, self.layout)
            self._checked_now()
        new = self._new(queues)
        if new:
            await self.home.conn.links.get().call(b"SADD", self._registry, *new)
            self._known.update(new)

    def _ready_sync(self, queues: Iterable[str] = ()) -> None:
        if not self._checked:
            layout.check_sync(self.home.conn.sync, self.url, self.prefix, self.layout)
            self._checked_now()
        new = self._new(queues)
        if new:
            self.home.conn.sync.call(b"SADD", self._registry, *new)
            self._known.update(new)

    def _checked_now(self) -> None:
        """The layout is the app's.  With one keyspace, the job path's
        methods become the home keyspace's own (instance attributes over
        this class's), so the default layout adds no call to a job's path."""
        self._checked = True
        if self._single:
            for name in _DIRECT:
                setattr(self, name, getattr(self.home, name))

    async def _named(self) -> list[tuple[str, Keyspace]]:
        """Every keyspace of the app, by queue name (``""``: home), in order."""
        if self._single:
            return [("", self.home)]
        got = await self.home.conn.links.get().call(b"SMEMBERS", self._registry)
        queues = sorted({m.decode() for m in got} | self._known)
        return [("", self.home), *((q, self.keyspace(q)) for q in queues)]

    async def _every(self, call: Callable[[Keyspace], Awaitable[T]]) -> list[T]:
        """``call`` on every keyspace of the app, concurrently."""
        spaces = [ks for _, ks in await self._named()]
        if len(spaces) == 1:
            return [await call(spaces[0])]
        return list(await asyncio.gather(*(call(ks) for ks in spaces)))

    def _groups(self, queues: Iterable[str]) -> list[tuple[Keyspace, list[str]]]:
        """``queues`` by keyspace, in the order of their first queue."""
        out: dict[Keyspace, list[str]] = {}
        for q in queues:
            out.setdefault(self.keyspace(q), []).append(q)
        return list(out.items())

    async def _by_queue(
        self, ds: Sequence[Delivery], call: Callable[[Keyspace, list[Delivery]], Awaitable[T]]
    ) -> list[T]:
        """``call`` on each keyspace with its deliveries, concurrently."""
        out: dict[Keyspace, list[Delivery]] = {}
        for d in ds:
            out.setdefault(self.keyspace(d.queue), []).append(d)
        if len(out) == 1:
            [(ks, part)] = out.items()
            return [await call(ks, part)]
        return list(await asyncio.gather(*(call(ks, part) for ks, part in out.items())))

    # -- transport ----------------------------------------------------------------

    async def open(self) -> None:
        # no round trip: the layout is checked by the first call that
        # writes or takes jobs (``_ready``)
        await self.home.open()

    async def close(self) -> None:
        for ks in self._local():
            await ks.close()

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        await self._ready(queues)
        homed = False
        for ks, qs in self._groups(queues):
            homed = homed or ks is self.home
            await ks.declare(qs, bindings if ks is self.home else ())
        if bindings and not homed:
            await self.home.declare([], bindings)

    def _split(self, msgs: Iterable[Message]) -> tuple[list[Message], list[Group]]:
        ms = list(msgs)
        out: dict[Keyspace, list[int]] = {}
        for i, m in enumerate(ms):
            out.setdefault(self.keyspace(m.queue), []).append(i)
        return ms, list(out.items())

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        if self._single:
            await self._ready()
            return await self.home.enqueue(msgs)
        ms, groups = self._split(msgs)
        await self._ready(m.queue for m in ms)
        if len(groups) == 1:
            return await groups[0][0].enqueue(ms)
        # concurrently: on a cluster, each keyspace's primary stores its
        # part; all or nothing per queue (layout.py)
        parts = await asyncio.gather(*(ks.enqueue([ms[i] for i in pos]) for ks, pos in groups))
        return _placed(ms, groups, parts)

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        if self._single:
            await self._ready()
            return await self.home.enqueue_bounded(msgs, max_ready)
        ms, groups = self._split(msgs)
        await self._ready(m.queue for m in ms)
        if len(groups) == 1:
            return await groups[0][0].enqueue_bounded(ms, max_ready)
        # a batch over several keyspaces cannot be checked in one script:
        # the seam's lock per bounded queue around a count (brokers/capacity.py)
        return await super().enqueue_bounded(ms, max_ready)

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        if self._single:
            self._ready_sync()
            return self.home.enqueue_sync(msgs)
        ms, groups = self._split(msgs)
        self._ready_sync(m.queue for m in ms)
        if len(groups) == 1:
            return groups[0][0].enqueue_sync(ms)
        parts = [ks.enqueue_sync([ms[i] for i in pos]) for ks, pos in groups]
        return _placed(ms, groups, parts)

    async def publish(self, msgs: Iterable[Message]) -> int:
        await self._ready()
        return await self.home.publish(msgs)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        self._ready_sync()
        return self.home.publish_sync(msgs)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        return await self.home.list_events(event_type, since, until, cursor, limit)

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        await self._ready(queues)
        if self._single:
            return await self.home.fetch(queues, limit, lease, wait, worker)
        groups = self._groups(queues)
        if len(groups) == 1:
            ks, qs = groups[0]
            return await ks.fetch(qs, limit, lease, wait, worker)
        # each keyspace in the order of the queues, without waiting...
        out: list[Delivery] = []
        try:
            for ks, qs in groups:
                if len(out) >= limit:
                    break
                out += await ks.fetch(qs, limit - len(out), lease, 0, worker)
        except BaseException:
            await asyncio.shield(self._give_back(out))
            raise
        if out or wait <= 0:
            return out
        # ...then, all idle, wait on each at once (a blocking call cannot
        # span slots): the first that gets work ends the others' waits, by a
        # wake-up in their inboxes (cancelling a BLPOP could drop a job its
        # reply was carrying: it would wait out its lease)
        stop = asyncio.Event()
        wids = [secrets.token_hex(8) for _ in groups]
        waits = [
            asyncio.ensure_future(ks.wait_fetch(qs, limit, lease, wait, worker, wid, stop))
            for (ks, qs), wid in zip(groups, wids, strict=True)
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            stop.set()
            for (ks, _), wid, w in zip(groups, wids, waits, strict=True):
                if not w.done():
                    await ks.wake(wid)
        except BaseException:
            # cancelled (the worker stops), or a wake-up failed: end every
            # wait the hard way; each gives back what it was handed
            for w in waits:
                w.cancel()
            await asyncio.shield(self._settle(waits, 0))
            raise
        return await self._settle(waits, limit)

    async def _settle(self, waits: Sequence[Waiting], limit: int) -> list[Delivery]:
        """Collect the waits (ended or ending); keep up to ``limit`` jobs,
        give back the rest."""
        results = await asyncio.gather(*waits, return_exceptions=True)
        got: list[Delivery] = []
        errors: list[BaseException] = []
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                continue
            if isinstance(r, BaseException):
                errors.append(r)
            else:
                got += r
        await self._give_back(got[limit:])
        if not got and errors:
            raise errors[0]
        return got[:limit]

    async def _give_back(self, ds: list[Delivery]) -> None:
        if ds:
            await self.requeue(ds)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if self._single:
            return await self.home.ack(ds)
        await self._by_queue(ds, Keyspace.ack)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if self._single:
            return await self.home.retry(ds)
        await self._by_queue(ds, Keyspace.retry)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if self._single:
            return await self.home.dead(ds)
        await self._by_queue(ds, Keyspace.dead)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if self._single:
            return await self.home.requeue(ds)
        await self._by_queue(ds, Keyspace.requeue)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if self._single:
            return await self.home.extend(ds, lease)
        lost = await self._by_queue(ds, lambda ks, part: ks.extend(part, lease))
        return list(itertools.chain.from_iterable(lost))

    async def cancel_running(self, ds: Sequence[Delivery]) -> list[str]:
        if self._single:
            return await self.home.cancel_running(ds)
        done = await self._by_queue(ds, Keyspace.cancel_running)
        return list(itertools.chain.from_iterable(done))

    async def rescue(self) -> Rescued:
        if self._single:
            return await self.home.rescue()
        parts = await self._every(Keyspace.rescue)
        return Rescued(sum(parts), itertools.chain.from_iterable(p.dead for p in parts))

    # -- admin --------------------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        rows = list(itertools.chain.from_iterable(await self._every(Keyspace.stats)))
        return sorted(rows, key=lambda r: r.queue) if not self._single else rows

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        if self._single:
            return await self.home.list_jobs(filter, cursor, limit)
        if filter.queue is not None:
            return await self.keyspace(filter.queue).list_jobs(filter, cursor, limit)
        # keyspace by keyspace (newest first within each), the cursor naming
        # the keyspace it stopped in and that keyspace's own cursor
        start, _, inner = (cursor or "").partition(_CURSOR_SEP)
        named = [(q, ks) for q, ks in await self._named() if cursor is None or q >= start]
        items: list[JobInfo] = []
        for q, ks in named:
            if len(items) >= limit:
                return Page(items=items, cursor=f"{q}{_CURSOR_SEP}")
            own = inner or None if cursor is not None and q == start else None
            page = await ks.list_jobs(filter, own, limit - len(items))
            items += page.items
            if page.cursor is not None:
                return Page(items=items, cursor=f"{q}{_CURSOR_SEP}{page.cursor}")
        return Page(items=items, cursor=None)

    async def get(self, id: str) -> JobInfo | None:
        if self._single:
            return await self.home.get(id)
        found = await self._every(lambda ks: ks.get(id))
        return next((info for info in found if info is not None), None)

    async def replay(self, filter: JobFilter) -> int:
        if filter.queue is not None:
            return await self.keyspace(filter.queue).replay(filter)
        return sum(await self._every(lambda ks: ks.replay(filter)))

    async def purge(self, filter: JobFilter) -> int:
        if filter.queue is not None:
            return await self.keyspace(filter.queue).purge(filter)
        return sum(await self._every(lambda ks: ks.purge(filter)))

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        if self._single:
            return await self.home.cancel(ids)
        return _in_order(ids, await self._every(lambda ks: ks.cancel(ids)))

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        if self._single:
            return await self.home.reschedule(ids, at)
        return _in_order(ids, await self._every(lambda ks: ks.reschedule(ids, at)))

    async def pause(self, queue: str) -> None:
        await self._ready([queue])
        await self.keyspace(queue).pause(queue)

    async def resume(self, queue: str) -> None:
        await self._ready([queue])
        await self.keyspace(queue).resume(queue)


def _placed(ms: list[Message], groups: list[Group], parts: Sequence[list[str]]) -> list[str]:
    """The ids of an enqueue split by keyspace, in the order of its messages."""
    ids = [m.id for m in ms]
    for (_, pos), got in zip(groups, parts, strict=True):
        for i, id_ in zip(pos, got, strict=True):
            ids[i] = id_
    return ids


def _in_order(ids: Sequence[str], parts: Iterable[list[str]]) -> list[str]:
    """The ids some keyspace moved, in the order they were asked for."""
    moved = set(itertools.chain.from_iterable(parts))
    return [i for i in dict.fromkeys(ids) if i in moved]
