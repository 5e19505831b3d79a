"""``kafka://HOST:PORT[,HOST2...]?state=URL&prefix=P``: Kafka carries the jobs.

One topic per queue (``P.q.QUEUE``, ``partitions=`` fixed when it is made),
the message key choosing the partition (the job's ``key``, else its id); one
topic per event type (``P.ev.TYPE``) read by one consumer group per
subscriber group; a dead-letter topic per queue (``P.dlq.QUEUE``) carrying
the error history in headers; delay tiers for ``eta`` and retries
(``delay.py``).  Offsets are leased per partition (``transport.py``); the
jobs' records, unique keys, limits, the scheduler's lease, results and the
admin's view live in the state store (``coordination.py``, ``records.py``).
See docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnknownError,
    UnsupportedSaslMechanismError,
)

from ...errors import BrokerError, BrokerUnavailable
from ...message import GROUP_PREFIX, Message, encode, encode_checked
from .. import failure, identity
from ..base import Broker, StateDelegation
from ..clock import ServerClock
from ..deadline import Backoff
from ..gate import Gate
from ..partitions import PartitionLag
from ..perloop import PerLoop
from ..types import Binding, Capabilities, Delivery, JobFilter, JobInfo, Page, QueueStats, Rescued
from . import admin, coordination, jobs
from . import options as o
from .belief import first_copy_headers
from .connection import Link, abandon
from .delay import Relay, tier_headers
from .engine import Out
from .held import Held
from .names import TIERS, Names, tier_for
from .produce import BATCH_FROM, Item, Sending, in_view, send_batched, send_one
from .records import Record
from .topics import Topics
from .transport import JOIN_WAIT, Copy, Reader

log = logging.getLogger("dumbwaiter.kafka")

#: copies a fetch of events judges beyond its limit: events held back behind
#: an earlier one of their key must not keep the next keys' from being looked
#: at (a copy of a job is never held back: a fetch of jobs judges only as
#: many as it may lease, and reads each record once)
LOOK_PAST = 64

#: seconds a fetch trusts the pauses it read (``KafkaBroker._paused``): a
#: queue resumed by another process is read from again within this
PAUSED_EVERY = 1.0

#: the shortest and longest pause before copies read before their records
#: are judged again (``KafkaBroker._recheck``)
RECHECK = (0.002, 0.25)

#: kinds of copy (version, priority, times) whose headers ``copy_of`` keeps
#: to share (a bulk enqueue's chunk is one kind; a settle's, a few)
_SHAPES = 64
#: a copy's header
Header = tuple[str, bytes]

#: the client library's failures the seam turns into ``BrokerError``
KAFKA_ERRORS: tuple[type[BaseException], ...] = (KafkaError, OSError)


#: the cluster refuses these for good (credentials, SASL mechanism, ACLs):
#: trying again within the producer's deadline cannot help
_REFUSED = (
    AuthenticationFailedError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    ClusterAuthorizationFailedError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
)


class KafkaBroker(StateDelegation):
    capabilities: ClassVar[Capabilities] = Capabilities(
        native_delay=True,
        priorities=False,
        blocking_fetch=True,
        events=True,
        ordered_keys=True,
        limits=True,
        multi_process=True,
        max_message_size=1_000_000,
    )
    schemes: ClassVar[tuple[str, ...]] = ("kafka",)
    client_errors: ClassVar[tuple[type[BaseException], ...]] = KAFKA_ERRORS

    def __init__(self, url: str) -> None:
        super().__init__(url)
        opts = o.parse(url)
        self.config = o.client_config(url, opts)
        self.names = Names(opts[o.PREFIX] or o.PREFIX.default)
        self.partitions = opts[o.PARTITIONS]
        self.replication = opts[o.REPLICATION]
        self.retention = opts[o.RETENTION]
        #: seconds a due job waits before its copy is written again (``jobs.reconcile``)
        self.stranded = opts[o.STRANDED]
        #: seconds a new job's copy read before its record waits for it
        #: (``jobs.enqueue`` writes both at once)
        self.record_grace = jobs.RECORD_GRACE
        #: how long a write of copies tries again while the cluster is away
        #: (a producer call's own deadline comes first: deadline.py)
        self.reconnect = opts[o.RECONNECT]
        #: when this process may next look for stranded jobs (``time.monotonic()``)
        self.reconcile_at = 0.0
        self.settings: dict[str, Any] = {
            "fetch_max_wait_ms": round(opts[o.FETCH_WAIT] * 1000),
            "session_timeout_ms": round(opts[o.SESSION_TIMEOUT] * 1000),
            "heartbeat_interval_ms": max(100, round(opts[o.SESSION_TIMEOUT] * 1000 / 10)),
        }
        single_host = opts[o.SINGLE_HOST]
        store = coordination.state_store(opts[o.STATE], url, single_host)
        self.state_url = store.url
        self._store = store
        self._gate = Gate(store, self._admit)
        #: the state store's clock, which every record's time is on: leases,
        #: run times and the delay tiers' due times agree between hosts
        #: whose own clocks do not (``clock.py``)
        self.clock = ServerClock()
        self.state: Broker = self._gate
        caps = replace(
            type(self).capabilities,
            limits=type(store).capabilities.limits,
            multi_host=type(store).capabilities.multi_host and not single_host,
        )
        setattr(self, "capabilities", caps)  # noqa: B010 (a per-instance ClassVar)
        self._links: PerLoop[Link] = PerLoop(lambda loop: Link(self.config, loop), _close, abandon)
        self._claimed = False
        self._topics = Topics(self.replication)
        #: queues this process has written to the admin's list
        self.known_queues: set[str] = set()
        #: what this process last wrote to the entries of the jobs it holds
        self.held = Held()
        #: the headers ``copy_of`` gave its last few kinds of copy, shared:
        #: a bulk enqueue's copies differ in their id only, and a copy a
        #: bulk enqueue keeps until it is acknowledged is then two objects,
        #: not six (fewer to make, and fewer for the cyclic GC to walk)
        self._headers: dict[tuple[int, int, float, float, float | None], tuple[Header, ...]] = {}
        #: copies written in the background (``send_soon``)
        self._sending: set[asyncio.Future[None]] = set()
        self.instance = secrets.token_hex(6)

    def __repr__(self) -> str:
        return f"<KafkaBroker {self.names.prefix} state={self._store!r}>"

    def failure(self, exc: BaseException) -> BrokerError:
        # refused for good: credentials or ACLs the cluster will not accept
        if isinstance(exc, _REFUSED):
            return failure.refused(self.url, exc, auth=True)
        # unavailable (a caller retries within its deadline): no connection,
        # an error the client calls retriable, or the unknown error a
        # restarting server answers a produce with (seen from tansu while it
        # came back empty: the restart test's producer)
        passing = isinstance(exc, KafkaError) and (exc.retriable or isinstance(exc, UnknownError))
        if isinstance(exc, (KafkaConnectionError, OSError)) or passing:
            return failure.unavailable(self.url, exc)
        return failure.failed(self.url, exc)

    @property
    def where(self) -> str:
        return f"the Kafka app {failure.server_name(self.url)} prefix {self.names.prefix!r}"

    # -- connections and the state store's admission ------------------------------

    def link(self) -> Link:
        return self._links.get()

    async def now(self) -> float:
        """The state store's time now (``clock.py``), read again when due."""
        if self.clock.due:
            await self.clock.try_sync(self._store_time)
        return self.clock.now()

    async def _store_time(self) -> float:
        t = await self._store.server_time()
        return time.time() if t is None else t

    async def _admit(self) -> None:
        """The gate's check: the cluster agrees our state store is the app's."""
        if self._claimed:
            return
        ours = await identity.identity_of(self._store)
        await coordination.claim(self.link(), self.names.state, self.replication, ours, self.where)
        self._claimed = True
        self.state = self._store

    async def forget_state_identity(self) -> bool:
        return await coordination.forget(self.link(), self.names.state)

    async def open(self) -> None:
        await self.state.open()
        await self.link().producer(self._request_size())

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        ours = {t for t in self._sending if t.get_loop() is loop}
        if ours:
            await asyncio.wait(ours, timeout=5.0)
        await self._links.close()
        await self._store.close()

    def _request_size(self) -> int:
        return max(1024 * 1024, (self.max_message_size or 0) + 64 * 1024)

    # -- topics ------------------------------------------------------------------------

    async def ensure_topics(self, topics: Iterable[str], partitions: int | None = None) -> None:
        n = self.partitions if partitions is None else partitions
        await self._topics.ensure(self.link(), ((t, (n, {})) for t in topics))

    async def ensure_queues(self, queues: Iterable[str]) -> None:
        """A queue's topic and its dead-letter topic (made with it: a worker
        that buries a job must not wait for a topic to be made first)."""
        n = self.names
        await self.ensure_topics(t for q in queues for t in (n.queue_topic(q), n.dlq_topic(q)))

    async def event_topic(self, event_type: str) -> str:
        topic = self.names.event_topic(event_type)
        if topic not in self._topics:
            ms = str(round(self.event_retention * 1000))
            await self._topics.ensure(
                self.link(), [(topic, (self.partitions, {"retention.ms": ms}))]
            )
            await self.state.kv_set({self.names.etype + event_type: b"1"})
        return topic

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        qs = {*queues, *(b.queue for b in bindings)}
        await self.ensure_queues(qs)
        items = {self.names.queue + q: b"1" for q in qs}
        for b in bindings:
            await self.event_topic(b.pattern)
            items[f"{self.names.binding}{b.queue}\x1f{b.pattern}"] = str(b.max_attempts).encode()
        if items:
            await self.state.kv_set(items)

    async def bindings(self) -> list[Binding]:
        out = []
        for k, v in (await self.state.kv_scan(self.names.binding)).items():
            queue, pattern = k[len(self.names.binding) :].split("\x1f", 1)
            out.append(Binding(pattern, queue, int(v)))
        return out

    # -- sending copies ----------------------------------------------------------------

    def copy_of(
        self,
        msg: Message,
        ver: int,
        run_at: float,
        now: float,
        body: bytes | None = None,
        written: float | None = None,
    ) -> Out:
        """The copy of a job at version ``ver``: to its queue's topic, or to a
        delay tier when ``run_at`` is ahead.  ``body``: the envelope, where
        the caller encoded it already (an enqueue, for its size check).
        ``written``: the time of the record a first copy goes with (an
        enqueue's, a publish's), which the copy then carries, so that it
        says what its record holds (``belief.py``)."""
        ready = max(run_at, now)
        shape = (ver, msg.priority, ready, run_at, written)
        same = self._headers.get(shape)
        if same is None:
            same = (
                ("dw-v", str(ver).encode()),
                ("dw-p", str(msg.priority).encode()),
                # when it is ready, in microseconds: the order a worker takes
                # what it has read in (Kafka's own times are milliseconds)
                ("dw-t", f"{ready:.6f}".encode()),
            )
            if written is not None:
                same += tuple(first_copy_headers(run_at, written))
            if len(self._headers) >= _SHAPES:
                self._headers.clear()
            self._headers[shape] = same
        headers = [("dw-id", msg.id.encode()), *same]
        topic = self.names.queue_topic(msg.queue)
        key = (msg.key or msg.id).encode()
        value = encode(msg) if body is None else body
        if run_at > now:
            tier = self.names.tier_topic(tier_for(run_at - now))
            return [(tier, key, value, tier_headers(headers, topic, run_at))]
        return [(topic, key, value, headers)]

    def dead_copy(self, msg: Message, raw: bytes | None = None) -> Out:
        """A dead letter for the DLQ topic: the envelope (or the ``raw`` bytes
        of a foreign record: ``foreign.py``), the error history in headers."""
        import orjson

        errs = msg.errors
        headers = [
            ("dw-id", msg.id.encode()),
            ("x-dw-attempts", str(msg.attempt).encode()),
            (
                "x-dw-errors",
                orjson.dumps(
                    [
                        {"attempt": e.attempt, "type": e.type, "message": e.message[:500]}
                        for e in errs[-20:]
                    ]
                ),
            ),
        ]
        if errs:
            headers.append(("x-dw-error-type", errs[-1].type.encode()))
            headers.append(("x-dw-error-message", errs[-1].message[:1000].encode()))
        value = encode(msg) if raw is None else raw
        return [(self.names.dlq_topic(msg.queue), msg.id.encode(), value, headers)]

    async def send(self, items: Out) -> None:
        """Write copies and wait until the cluster acknowledged every one
        (acks=all), trying again while the cluster is unreachable or
        restarting (a producer call until its deadline, anything else for
        ``reconnect`` seconds).  A copy written twice is judged by its record
        like any redelivered one: the job runs once."""
        if not items:
            return
        backoff: Backoff | None = None
        while True:
            try:
                return await self._send_once(items)
            except KAFKA_ERRORS as exc:
                if not isinstance(self.failure(exc), BrokerUnavailable):
                    raise
                backoff = backoff or Backoff(self.reconnect)
                pause = backoff.pause()
                if pause is None:
                    raise
                log.info("kafka: writing copies failed (%r); trying again", exc)
                await asyncio.sleep(pause)
                try:  # a restarted cluster may have lost the topics made here
                    await self._topics.check(self.link())
                except KAFKA_ERRORS:
                    pass  # still away: the next write says so

    async def _send_once(self, items: Out) -> None:
        futures = await self._hand_over(items)
        try:
            await asyncio.gather(*futures)
        except KafkaError:
            self._topics.check_soon()  # a topic may be gone: the next fetch looks
            raise

    async def start_send(self, items: Out) -> Sending:
        """Hand copies to the producer without waiting for the cluster:
        ``wait()`` on the answer does (trying again as ``send`` does)."""
        try:
            futures: list[asyncio.Future[object]] | None = await self._hand_over(items)
        except KAFKA_ERRORS as exc:
            if not self._retriable(exc):
                raise
            futures = None  # ``wait`` writes them, trying again
        return Sending(futures, items, self._send_again, self._retriable)

    async def _send_again(self, items: Sequence[Item]) -> None:
        await self.send(list(items))

    def _retriable(self, exc: BaseException) -> bool:
        if isinstance(exc, KafkaError):
            self._topics.check_soon()
        return isinstance(exc, KAFKA_ERRORS) and isinstance(self.failure(exc), BrokerUnavailable)

    async def _hand_over(self, items: Out) -> list[asyncio.Future[object]]:
        """Give copies to the producer: a future for each record (or batch)."""
        topics = {t for t, *_ in items}
        tiers = self.names.tiers
        await self.ensure_topics(t for t in topics if t not in tiers)
        if topics & tiers:
            await self.ensure_topics(tiers, 1)
        producer = await self.link().producer(self._request_size())
        await in_view(producer, topics, self._remake)
        try:
            if len(items) >= BATCH_FROM:
                return await send_batched(producer, items)
            return [await send_one(producer, item) for item in items]
        except KafkaError:
            self._topics.check_soon()
            raise

    async def _remake(self) -> None:
        """Make again the topics the cluster lost (a copy's topic it did not list)."""
        self._topics.check_soon()
        await self._topics.check(self.link())

    def send_soon(self, items: Out) -> None:
        """``send`` in a task of its own, for copies nobody waits for (the
        DLQ topic's view of a job the record already says is dead)."""
        if not items:
            return
        task = asyncio.ensure_future(self.send(items))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Future[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("kafka: a dead letter's copy was not written: %r", task.exception())

    # -- enqueue and publish -------------------------------------------------------------

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        # every envelope encoded (and its size checked) before anything is
        # stored; kept by id, not in a (message, envelope) pair each: a bulk
        # enqueue keeps them all until it returns, and each pair would be
        # one more object for the cyclic GC to walk
        batch = list(msgs)
        if not batch:
            return []
        limit = self.max_message_size
        bodies = {m.id: encode_checked(m, limit) for m in batch}
        return await jobs.enqueue(self, batch, bodies)

    async def publish(self, msgs: Iterable[Message]) -> int:
        batch = [m for m in msgs if encode_checked(m, self.max_message_size) is not None]
        if not batch:
            return 0
        return await jobs.publish(self, batch)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        return await admin.list_events(self, event_type, since, until, cursor, limit)

    # -- fetch ---------------------------------------------------------------------------

    def _reader(self, link: Link, group: str) -> Reader:
        reader = link.readers.get(group)
        if reader is None:
            reader = link.readers[group] = Reader(group, self.config, self.settings)
        return reader

    async def _start_relay(self, link: Link) -> None:
        if link.relay is not None:
            return
        await self.ensure_topics((self.names.tier_topic(i) for i in range(len(TIERS))), 1)
        consumer = AIOKafkaConsumer(
            **self.config,
            **self.settings,
            group_id=self.names.relay_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        producer = await link.producer(self._request_size())
        link.relay = Relay(consumer, producer, self.names.tier_topic, self.clock.now, self._remake)
        link.relay.start()

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        link = self.link()
        async with link.fetching:
            return await self._fetch(link, queues, limit, lease, wait, worker)

    async def _fetch(
        self,
        link: Link,
        queues: Sequence[str],
        limit: int,
        lease: float,
        wait: float,
        worker: str,
    ) -> list[Delivery]:
        await self.state.open()  # the admission, before anything is read
        await link.arm()
        await self._topics.check(link)
        paused = await self._paused(link, queues)
        live = [q for q in queues if q not in paused]
        await self.ensure_queues(queues)
        await self._start_relay(link)
        readers: list[tuple[Reader, str | None]] = []
        topic_queues = {self.names.queue_topic(q): q for q in live}
        jobs_reader = self._reader(link, self.names.jobs_group)
        await jobs_reader.follow(frozenset(self.names.queue_topic(q) for q in live))
        readers.append((jobs_reader, None))
        groups = [q for q in live if q.startswith(GROUP_PREFIX)]
        if groups:
            bound = await self.bindings()
            for q in groups:
                types = {b.pattern for b in bound if b.queue == q}
                topics = frozenset([await self.event_topic(t) for t in types])
                reader = self._reader(link, self.names.group_of(q))
                await reader.follow(topics)
                readers.append((reader, q))
        now_m = time.monotonic()
        deadline, join_by = now_m + wait, now_m + max(wait, JOIN_WAIT)
        out: list[Delivery] = []
        #: copies read before their records (``jobs.enqueue``), judged again soon
        awaiting: list[Copy] = []
        first = True
        while True:
            awaiting.clear()
            for reader, _ in readers:
                # a fetch that waits reads until its deadline anyway; one that
                # does not must still find what was written before it began
                joined = reader.topics and await reader.ensure_joined(join_by)
                if joined and first and wait <= 0:
                    await reader.catch_up()
            first = False
            for reader, group_queue in readers:
                if len(out) < limit:
                    out += await self._judge(
                        link,
                        reader,
                        group_queue,
                        limit - len(out),
                        lease,
                        worker,
                        topic_queues,
                        awaiting,
                    )
                if out:
                    await reader.commit_due()
                else:  # before it waits: the marks of everything judged
                    await reader.commit()
            if out:
                return out
            if time.monotonic() >= deadline:
                if wait > 0 or not _rejoining(readers, join_by):
                    return out
                first = True  # rejoined: catch up on what it holds now
                continue
            left = deadline - time.monotonic()
            per = left if len(readers) == 1 else min(left, 0.1)
            if awaiting:
                per = min(per, self._recheck(awaiting))
            for reader, _ in readers:
                reader.waiting = True
                try:
                    await reader.pull(per)
                finally:
                    reader.waiting = False

    async def _paused(self, link: Link, queues: Sequence[str]) -> set[str]:
        """The paused ones of ``queues``, read at most every ``PAUSED_EVERY``
        seconds: which topics a fetch follows.  That a copy of a paused queue
        is never leased is the judge's (``jobs.judge`` reads the queue's
        pause with the records it leases): a pause from another process
        stops the leases at once, and its topic is let go within this."""
        now_m = time.monotonic()
        if now_m - link.paused_at >= PAUSED_EVERY or any(q not in link.paused for q in queues):
            got = await self.state.kv_get([self.names.paused + q for q in queues])
            link.paused = {q: self.names.paused + q in got for q in queues}
            link.paused_at = now_m
        return {q for q in queues if link.paused[q]}

    def _look_again(self) -> None:
        """This process paused or resumed a queue: the next fetch reads it."""
        for _, link in self._links.items():
            link.paused_at = 0.0

    async def _judge(
        self,
        link: Link,
        reader: Reader,
        group_queue: str | None,
        limit: int,
        lease: float,
        worker: str,
        topic_queues: dict[str, str],
        awaiting: list[Copy],
    ) -> list[Delivery]:
        """Lease up to ``limit`` jobs of the copies ``reader`` holds.  The
        copies that wait for their record are set aside, so those behind
        them are judged, and kept for the next fetch (and in ``awaiting``)."""
        out: list[Delivery] = []
        past = 0 if group_queue is None else LOOK_PAST
        aside: list[Copy] = []
        while len(out) < limit and reader.buffer:
            copies = reader.take(limit - len(out) + past)
            unrecorded: list[Copy] = []
            got, waiting = await jobs.judge(
                self, copies, group_queue, lease, worker, limit - len(out), topic_queues, unrecorded
            )
            for d, c in got:
                reader.hold(d.id, c.tp)
                link.held[d.id] = reader
            out += [d for d, _ in got]
            aside += unrecorded
            later = set(map(id, unrecorded))
            held_back = [c for c in waiting if id(c) not in later]
            reader.give_back(held_back)
            reader.done([c for c in copies if c not in waiting])
            if held_back and not got:
                break  # what is left waits for a key's earlier event
        reader.give_back(aside)
        awaiting += aside
        return out

    def _recheck(self, awaiting: Sequence[Copy]) -> float:
        """Seconds until copies waiting for their records are judged again:
        a quarter of the youngest one's age, between ``RECHECK``'s bounds
        (a record on its way comes within a moment; one that never comes
        costs a few reads until the grace is over)."""
        age = self.clock.now() - max(c.ready_at for c in awaiting)
        return min(RECHECK[1], max(RECHECK[0], age / 4))

    # -- outcomes ---------------------------------------------------------------------

    async def ack(self, ds: Sequence[Delivery]) -> None:
        await jobs.settle(self, ds, jobs.acked)
        self._let_go(ds)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        await jobs.settle(self, ds, jobs.retried)
        self._let_go(ds)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        await jobs.settle(self, ds, jobs.died)
        self._let_go(ds)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        await jobs.settle(self, ds, jobs.requeued)
        self._let_go(ds)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        lost = await jobs.extend(self, ds, lease)
        self._let_go(lost)
        return lost

    def _let_go(self, ds: Sequence[Delivery]) -> None:
        """These jobs no longer keep their partitions busy here (``assign.py``)."""
        for _, link in self._links.items():
            for d in ds:
                reader = link.held.pop(d.id, None)
                if reader is not None:
                    reader.let_go(d.id)

    async def rescue(self) -> Rescued:
        # the reconcile first: what ``rescue`` buries is reported the moment
        # it is stored (a caller may stop the worker as soon as it sees it)
        await jobs.reconcile(self)
        return await jobs.rescue(self)

    # -- admin ------------------------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        return await admin.stats(self)

    async def partition_lag(self) -> list[PartitionLag]:
        link = self._links.current()
        if link is not None:  # this process' marks first (a busy fetch commits them later)
            for reader in list(link.readers.values()):
                await reader.commit()
        return await admin.lag(self)

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        return await admin.list_jobs(self, filter, cursor, limit)

    async def get(self, id: str) -> JobInfo | None:
        got = await self.state.kv_get([self.names.job + id])
        raw = got.get(self.names.job + id)
        return None if raw is None else Record.load(raw).info(await self.now())

    async def replay(self, filter: JobFilter) -> int:
        return await admin.replay(self, filter)

    async def purge(self, filter: JobFilter) -> int:
        return await admin.purge(self, filter)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        return await jobs.cancel(self, ids)

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        return await jobs.reschedule(self, ids, at)

    async def pause(self, queue: str) -> None:
        await self.state.kv_set({self.names.paused + queue: b"1", self.names.queue + queue: b"1"})
        self._look_again()

    async def resume(self, queue: str) -> None:
        await self.state.kv_delete([self.names.paused + queue])
        self._look_again()


async def _close(link: Link) -> None:
    await link.close()


def _rejoining(readers: Sequence[tuple[Reader, str | None]], join_by: float) -> bool:
    """Whether a rebalance met by a fetch that does not wait is still going
    on (a reader lost its partitions and has not got its new ones): its
    "nothing" would not mean the queues are empty, as the copies it let go
    may come back to it."""
    if time.monotonic() >= join_by:
        return False
    return any(r.topics and not r.joined.is_set() for r, _ in readers)
