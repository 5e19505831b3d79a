"""Reading copies through a consumer group, with leases on offsets.

A fetch reads copies of jobs through a consumer group and judges each one
against its record (``records.py``); the record, not the offset, is the
job's lease.  The offsets only say how far a partition has been *judged*:

* every copy read is *pending* until its judgement is stored (taken: the
  record is ``running`` under this worker's lease; dropped: stale, done or
  cancelled), and copies complete out of order (a fetch of ``limit`` jobs
  judges the oldest of what it read and keeps the rest for the next fetch);
* the committed offset of a partition is its low-water mark: the first
  offset still pending (or the end of what was read), so a crash loses no
  copy that was not judged, and a copy judged twice is judged by the record;
* commits are synchronous when a rebalance takes partitions away
  (``on_partitions_revoked``), and the copies read from them and not judged
  yet are let go: the new owner reads them again from that mark;
* a job runs under its record's lease, not under its offset, so a long job
  never holds back the commits of later offsets, and a worker killed while
  it runs one loses the lease, not the copy: ``rescue`` writes a new copy
  when the lease runs out.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from .assign import BusyFirstAssignor
from .connection import started

log = logging.getLogger("dumbwaiter.kafka")

#: seconds a fetch waits for its consumer to join its group (once, and again
#: while a rebalance runs), whatever its own ``wait``
JOIN_WAIT = 30.0
#: seconds one read of a catch-up waits beyond the server's fetch wait
CATCH_UP_READ = 0.05
#: seconds a catch-up goes on at most (a fetch must return)
CATCH_UP_MAX = 5.0
#: seconds one commit may take: aiokafka retries a retriable error for ever
#: (a partition the cluster no longer knows, after a server that lost its
#: topics came back), and a commit on revoke that never returns holds the
#: group's rejoin, and with it every fetch, for ever
COMMIT_WAIT = 5.0
#: seconds between the commits of a fetch loop that finds copies every time
#: (one that finds none, a rebalance and a close commit at once): what a
#: crash makes the next owner read again, to be judged by the records
COMMIT_EVERY = 0.5
#: seconds between two looks for partitions whose log ends before this
#: consumer's position (``Reader.realign``)
ALIGN_EVERY = 1.0
#: seconds a look waits for a partition's position (one being reset has none)
ALIGN_WAIT = 0.05


@dataclass(slots=True, eq=False)
class Copy:
    """One record read from a partition, not judged yet."""

    tp: TopicPartition
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp: float

    def header(self, name: str) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode(errors="replace")

    @property
    def ready_at(self) -> float:
        """When it became ready (``dw-t``, seconds), else the record's time."""
        try:
            return float(self.header("dw-t") or self.header("dw-at") or self.timestamp)
        except ValueError:
            return self.timestamp

    @property
    def priority(self) -> int:
        try:
            return int(self.header("dw-p") or 0)
        except ValueError:
            return 0


#: a buffered copy in the reader's heap, in the order a fetch judges copies
#: (higher priority, then older, then lower offset; then the order read, so
#: that two entries never compare their copies): computed once, when read
Entry = tuple[int, float, int, int, Copy]


def entry(c: Copy, seq: int) -> Entry:
    return (-c.priority, c.ready_at, c.offset, seq, c)


def copy_of(rec: ConsumerRecord[Any, Any]) -> Copy:
    return Copy(
        tp=TopicPartition(rec.topic, rec.partition),
        offset=rec.offset,
        key=rec.key,
        value=rec.value or b"",
        headers={k: bytes(v) for k, v in rec.headers or ()},
        timestamp=rec.timestamp / 1000.0,
    )


@dataclass(slots=True)
class Tracker:
    """The offsets of one partition read by this consumer (see the module
    docstring): ``pending`` were read and not judged; ``end`` is one past the
    last read; ``committed`` the last mark committed.  ``order`` holds the
    pending offsets as a heap (with judged ones not yet popped), so the
    low-water mark of a read-ahead of thousands costs no scan."""

    end: int = -1
    committed: int = -1
    pending: set[int] = field(default_factory=set)
    order: list[int] = field(default_factory=list)

    def read(self, offset: int) -> None:
        if offset not in self.pending:
            self.pending.add(offset)
            heapq.heappush(self.order, offset)  # in order as read: no sifting
        self.end = max(self.end, offset + 1)

    def low_water(self) -> int:
        order, pending = self.order, self.pending
        while order and order[0] not in pending:
            heapq.heappop(order)
        return order[0] if order else self.end


class Reader(ConsumerRebalanceListener):  # type: ignore[misc]
    """One consumer group's consumer on this loop, its offsets and the copies
    it read and has not judged."""

    def __init__(self, group: str, config: dict[str, Any], settings: dict[str, Any]) -> None:
        self.group = group
        self.fetch_wait = settings.get("fetch_max_wait_ms", 500) / 1000.0
        self._settings = {**config, **settings}
        self.consumer = self._new_consumer()
        self.topics: frozenset[str] = frozenset()
        self.trackers: dict[TopicPartition, Tracker] = {}
        #: copies read and not judged: a heap (``Entry``), so a fetch takes
        #: the first few without sorting everything read ahead of it
        self.buffer: list[Entry] = []
        self._seq = 0
        #: partitions whose leased jobs run here, by job id (``assign.py``)
        self.busy: dict[str, TopicPartition] = {}
        #: what a rebalance took away (told at the join that follows it)
        self.was_held: set[TopicPartition] = set()
        self.joined = asyncio.Event()
        self._started = False
        #: a fetch is waiting on this reader (tests look: ``until_fetch_waits``)
        self.waiting = False
        #: when the marks of every partition were last committed (monotonic)
        self.committed_at = 0.0
        #: when ``realign`` looks next (monotonic)
        self._align_at = 0.0

    def _new_consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            **self._settings,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(BusyFirstAssignor.for_reader(self.holdings),),
        )

    # -- what the assignor is told ---------------------------------------------------

    def holdings(self) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
        held = {(tp.topic, tp.partition) for tp in [*self.trackers, *self.was_held]}
        busy = {(tp.topic, tp.partition) for tp in self.busy.values()}
        return held, busy

    def hold(self, job: str, tp: TopicPartition) -> None:
        self.busy[job] = tp

    def let_go(self, job: str) -> None:
        self.busy.pop(job, None)

    # -- the rebalance listener -------------------------------------------------------

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        self.joined.clear()
        gone = set(revoked)
        self.was_held = gone
        try:
            await self.commit(gone)
        except KafkaError as exc:  # the next owner judges those copies again
            log.info("kafka %s: commit on revoke failed: %r", self.group, exc)
        self.buffer = [e for e in self.buffer if e[4].tp not in gone]
        heapq.heapify(self.buffer)
        for tp in gone:
            self.trackers.pop(tp, None)

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self.was_held = set()
        for tp in assigned:
            self.trackers.setdefault(tp, Tracker())
        self.joined.set()

    # -- reading ------------------------------------------------------------------------

    async def follow(self, topics: frozenset[str]) -> None:
        """Read these topics (a change of the set rejoins the group)."""
        if not self._started:
            try:
                await started(self.consumer)
            except BaseException:
                # (a fetch cancelled meanwhile: ``started`` closed the
                # consumer; the next follow starts a new one)
                self.consumer = self._new_consumer()
                raise
            self._started = True
        if topics != self.topics:
            self.topics = topics
            self.joined.clear()
            if topics:
                self.consumer.subscribe(topics=sorted(topics), listener=self)
            else:
                self.consumer.unsubscribe()
                self.buffer, self.trackers = [], {}

    async def pull(self, timeout: float) -> int:
        """Read what arrives within ``timeout`` seconds into the buffer."""
        if not self.topics:
            await asyncio.sleep(timeout)
            return 0
        try:
            got = await self.consumer.getmany(timeout_ms=max(0, round(timeout * 1000)))
        except IllegalStateError:  # subscription changed under us: read again next time
            return 0
        n = 0
        for tp, recs in got.items():
            tracker = self.trackers.get(tp)
            if tracker is None:  # revoked meanwhile
                continue
            for rec in recs:
                tracker.read(rec.offset)
                self._push(copy_of(rec))
                n += 1
        if time.monotonic() >= self._align_at:
            await self.realign()
        return n

    async def realign(self) -> list[TopicPartition]:
        """Read again from its start each partition whose log now ends before
        this consumer's position (returns them): the cluster lost records it
        had acknowledged (a server that keeps nothing over a restart, as
        tansu; an unclean leader election).  Apache Kafka answers a fetch
        past the end with OFFSET_OUT_OF_RANGE, which the consumer's
        ``auto_offset_reset`` turns into a read from the start; tansu 0.6
        answers it with nothing, so the consumer would wait there, for
        offsets it already read, while every new copy (the reconcile's
        among them) lands below it.  The copies read from the lost log and
        not judged are forgotten: their records decide, and the reconcile
        writes again those still waiting."""
        self._align_at = time.monotonic() + ALIGN_EVERY
        c = self.consumer
        lost: list[TopicPartition] = []
        for tp in list(self.trackers):
            try:
                high = c.highwater(tp)
                if high is None:
                    continue
                position = await asyncio.wait_for(c.position(tp), ALIGN_WAIT)
            except (IllegalStateError, AssertionError, TimeoutError):
                continue  # revoked, or still looking up where to start
            if position > high:
                lost.append(tp)
        if not lost:
            return lost
        log.warning(
            "kafka %s: the cluster's log of %s ends before what this consumer read; "
            "reading it again from its start",
            self.group,
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in lost),
        )
        gone = set(lost)
        self.buffer = [e for e in self.buffer if e[4].tp not in gone]
        heapq.heapify(self.buffer)
        for tp in lost:
            self.trackers[tp] = Tracker()
        try:
            await c.seek_to_beginning(*lost)
        except IllegalStateError:
            pass  # revoked meanwhile: the next owner starts from the group's mark
        return lost

    async def ensure_joined(self, deadline: float) -> bool:
        """Until the consumer holds its assignment (or ``deadline``, monotonic)."""
        while not self.joined.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # a read drives the join in aiokafka's coordinator
            await self.pull(min(left, 0.1))
        return True

    async def catch_up(self) -> None:
        """Read what was written before now to the partitions held: a fetch
        must find a job whose enqueue returned before it started.  Reads
        until a read comes back empty *and* every partition held was
        answered by a fetch since the catch-up began, read up to the
        high-water mark that answer gave: an empty read alone also comes
        from a consumer that just joined and is still looking up where to
        start (a loaded machine), which is not an empty partition.  Not
        up to ``end_offsets``: tansu 0.6 answers a ListOffsets after a
        batched produce with the batch's first offset, not one past its last."""
        if not self.consumer.assignment():
            return
        since = time.time() * 1000  # aiokafka stamps an answer with the wall clock, in ms
        stop = time.monotonic() + CATCH_UP_MAX
        # longer than the server holds a fetch: a fetch it holds answers by then
        read = self.fetch_wait + CATCH_UP_READ
        while time.monotonic() < stop:
            if not await self.pull(read) and await self._read_to_answers(since):
                return

    async def _read_to_answers(self, since: float) -> bool:
        """Whether each partition held had a fetch answered after ``since``
        (ms) and was read up to the high-water mark of that answer."""
        c = self.consumer
        try:
            for tp in list(c.assignment()):
                seen, high = c.last_poll_timestamp(tp), c.highwater(tp)
                if seen is None or seen < since or high is None or await c.position(tp) < high:
                    return False
        except (IllegalStateError, AssertionError):  # revoked meanwhile: look again
            return False
        return True

    def _push(self, c: Copy) -> None:
        self._seq += 1
        heapq.heappush(self.buffer, entry(c, self._seq))

    def take(self, n: int) -> list[Copy]:
        """The ``n`` copies to judge first: higher priority, then older."""
        buf = self.buffer
        return [heapq.heappop(buf)[4] for _ in range(min(n, len(buf)))]

    def give_back(self, copies: Sequence[Copy]) -> None:
        """Copies read and not judged (the fetch had enough): kept for the next."""
        for c in copies:
            if c.tp in self.trackers:
                self._push(c)

    def done(self, copies: Sequence[Copy]) -> None:
        for c in copies:
            tracker = self.trackers.get(c.tp)
            if tracker is not None:
                tracker.pending.discard(c.offset)

    def drop_buffered(self, topics: set[str]) -> None:
        """Forget copies of these topics read but not judged (their queue is
        paused): seek back so they are read again when it resumes."""
        keep: list[Entry] = []
        first: dict[TopicPartition, int] = {}
        for e in self.buffer:
            c = e[4]
            if c.tp.topic in topics:
                first[c.tp] = min(first.get(c.tp, c.offset), c.offset)
            else:
                keep.append(e)
        heapq.heapify(keep)
        self.buffer = keep
        for tp, offset in first.items():
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.pending = {o for o in tracker.pending if o < offset}
                tracker.order = sorted(tracker.pending)
                tracker.end = offset
            try:
                self.consumer.seek(tp, offset)
            except IllegalStateError:
                pass

    async def commit_due(self) -> None:
        """``commit``, unless one was made less than ``COMMIT_EVERY`` ago: a
        busy fetch loop does not wait for the cluster on every fetch."""
        if time.monotonic() - self.committed_at >= COMMIT_EVERY:
            await self.commit()

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit each partition's low-water mark where it moved."""
        if only is None:
            self.committed_at = time.monotonic()
        offsets: dict[TopicPartition, int] = {}
        for tp, tracker in self.trackers.items():
            if only is not None and tp not in only:
                continue
            low = tracker.low_water()
            if low > tracker.committed and low >= 0:
                offsets[tp] = low
        if not offsets:
            return
        try:
            await asyncio.wait_for(self.consumer.commit(offsets), COMMIT_WAIT)
        except (CommitFailedError, IllegalStateError) as exc:
            log.debug("kafka %s: commit after a rebalance refused: %r", self.group, exc)
            return
        except TimeoutError:
            # the copies past the old mark are judged again by whoever reads
            # them next (the record decides): a lost commit costs a re-read
            log.info("kafka %s: a commit took over %.0f s; given up", self.group, COMMIT_WAIT)
            return
        for tp, low in offsets.items():
            kept = self.trackers.get(tp)
            if kept is not None:
                kept.committed = low

    async def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                await self.commit()
            except KafkaError as exc:
                log.debug("kafka %s: commit at close failed: %r", self.group, exc)
        await self.consumer.stop()  # also one never started: it holds a client
