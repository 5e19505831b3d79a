"""The broker seam: the one boundary between dumbwaiter and a storage engine.

It is small, async and batch-first: every call takes or returns many
messages, so an engine can do a batch in one round trip.  It has three parts:

* **transport** (required): ``open``, ``close``, ``declare``, ``enqueue``,
  ``publish``, ``fetch``, ``ack``, ``retry``, ``dead``, ``requeue``,
  ``extend``, ``rescue``;
* **admin** (CLI, dashboard): ``stats``, ``list_jobs``, ``get``, ``replay``,
  ``purge``, ``pause``, ``resume``, ``cancel`` (and ``cancel_running``, with
  a default built on ``requeue`` and ``cancel``, for the worker);
* **coordination** (scheduler, workflows, limits): ``acquire``, ``renew``,
  ``release`` (leases with fencing tokens) and a small key-value store
  (``kv_get``, ``kv_set``, ``kv_add``, ``kv_incr``, ``kv_delete``, ``kv_scan``).

The rules each engine must keep are written on the methods below and checked
by ``tests/conformance``, which every broker runs.  Code above the seam
branches on ``capabilities``, never on the broker's class.

A worker holds a ``Delivery``: the message plus its lease.  The worker writes
the outcome onto the delivery (``result``, ``error``, ``retry_at``) before it
hands a batch to ``ack``, ``retry`` or ``dead``, so each call stays one list.
"""

from __future__ import annotations

import abc
import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

from ..errors import BrokerError, DumbwaiterError
from ..message import DEFAULT_MAX_MESSAGE_SIZE, Message
from ..redact import mask_url
from . import capacity, failure
from .partitions import PartitionLag
from .types import (
    Binding,
    Capabilities,
    Delivery,
    JobFilter,
    JobInfo,
    Page,
    QueueStats,
    Rescued,
)

if TYPE_CHECKING:
    from ..sqldb import Sql

T = TypeVar("T")

#: seconds events stay in the log (and consumers' inbox marks) by default: 7 days
DEFAULT_EVENT_RETENTION = 7 * 86400.0

#: seconds ahead ``cancel_running`` parks a job between its requeue and its cancel
CANCEL_PARK = 3600.0

#: what a ``kv_update``'s ``decide`` may store under a key: the value (kept
#: with no expiry), or ``(value, ttl)``: the value kept ``ttl`` seconds
#: (``None``: no expiry)
KvWrite: TypeAlias = bytes | tuple[bytes, float | None]


def kv_write(value: KvWrite) -> tuple[bytes, float | None]:
    """``(value, ttl)`` of one of ``decide``'s writes, in either form."""
    if isinstance(value, tuple):
        data, ttl = value
        return bytes(data), ttl
    return bytes(value), None


#: dead letters a broker found outside ``rescue()`` (at fetch) and keeps for
#: the next ``rescue()`` to report: at most this many, the oldest dropped first
#: (only a process that fetches and never rescues would fill it)
FOUND_DEAD_LIMIT = 10_000


class Broker(abc.ABC):
    """Base class of every engine.  Subclasses implement the abstract methods.

    Every failure a seam method can meet reaches its caller as a
    ``BrokerError``: a subclass lists its client library's exceptions in
    ``client_errors``, and each public method of the seam (the methods of
    this class) is wrapped, when the subclass is made, to turn those into
    the ``BrokerError`` its ``failure`` chooses, with the client's exception
    as the ``__cause__``.  Inside the broker, code keeps catching its
    client's own exceptions (a retry on a lost connection); the wrapping is
    at the seam only, so ``except dw.BrokerError`` around any call (an
    enqueue, a CLI command, a worker's fetch) sees every failure."""

    #: what this engine offers (override in each subclass)
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: URL schemes this class serves
    schemes: ClassVar[tuple[str, ...]] = ()
    #: the client library's exceptions that the seam turns into ``BrokerError``
    client_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.client_errors:
            return
        for name in SEAM:
            fn = getattr(cls, name, None)
            if callable(fn) and not getattr(fn, "_dw_guarded", False):
                setattr(cls, name, _guarded(fn))

    def failure(self, exc: BaseException) -> BrokerError:
        """The ``BrokerError`` a caller sees for ``exc``, one of
        ``client_errors`` (engines sort out the unavailable and the refused;
        see failure.py)."""
        return failure.failed(self.url, exc)

    #: where an engine keeps its job state apart from its transport
    #: (RabbitMQ's ``state=``): that store's URL, so the doctor and the
    #: dashboard can name it; None where the transport holds the state
    state_url: str | None = None

    def __init__(self, url: str) -> None:
        self.url = url
        #: largest encoded message ``enqueue``/``publish`` accept (the App sets it)
        self.max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE
        #: seconds published events stay in the log for replay (the App sets it)
        self.event_retention: float = DEFAULT_EVENT_RETENTION

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {mask_url(self.url)}>"

    async def forget_state_identity(self) -> bool:
        """Forget which state store this broker's namespace announced, so the
        next process to start announces its own: how an app moves to another
        state store on purpose (``dumbwaiter state reset-identity``).

        Only an engine that keeps its job state apart from its transport
        (``state_url``) announces one: the others return False, having
        nothing to forget (their namespace *is* the state).  Raises
        ``ConfigurationError`` while a process that announced it still runs."""
        return False

    # -- transport -------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect.  Idempotent; the other methods call it when needed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Disconnect.  Idempotent; safe without ``open``."""

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        """Create queues and event bindings if missing; a binding declared again
        takes its new ``max_attempts``.  Idempotent."""
        return None

    @abc.abstractmethod
    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        """Store jobs; return their ids in order.

        A message whose ``id`` is already stored, or whose task ``key`` is held
        by a stored job, is not stored again: its slot in the result holds the
        id of the job already there.  A message encoded larger than
        ``max_message_size`` raises ``PayloadTooLarge`` and nothing of the
        batch is stored (use ``message.encode_checked``).  ``msgs`` may be a
        one-pass iterator that raises while it is consumed: then nothing of
        the batch is stored either.  ``eta`` in the future makes a
        ``scheduled`` job; otherwise it is ``ready`` at once.
        """

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        """``enqueue``, unless a queue named in ``max_ready`` would then hold
        more waiting jobs (ready, scheduled, retrying) than its bound: then
        raise ``QueueFull`` and store nothing of the batch.  Atomic against
        every other producer's ``enqueue_bounded``: concurrent producers
        never admit more than the bound.  The default takes a lock per
        bounded queue around a count (brokers/capacity.py); an engine that
        counts inside its own enqueue step overrides it and reports
        ``capabilities.native_capacity``."""
        return await capacity.enqueue_locked(self, msgs, max_ready)

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        """``enqueue`` for sync callers, where ``capabilities.sync_enqueue``."""
        raise NotImplementedError(f"{type(self).__name__} has no sync enqueue path")

    # The transactional outbox's fast path (where ``capabilities.transactional_outbox``):
    # when the caller's connection is to the broker's own database, jobs and
    # events are written by the caller's transaction itself.

    async def owns_connection(self, sql: Sql) -> bool:
        """Whether ``sql`` (the caller's connection) is this broker's database."""
        return False

    def owns_connection_sync(self, sql: Sql) -> bool:
        return False

    async def enqueue_with(self, sql: Sql, msgs: Sequence[Message]) -> None:
        """Store jobs and publish events inside the caller's transaction on
        ``sql`` (where ``owns_connection(sql)``): nothing is visible before its commit."""
        raise NotImplementedError(f"{type(self).__name__} cannot join the caller's transaction")

    def enqueue_with_sync(self, sql: Sql, msgs: Sequence[Message]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot join the caller's transaction")

    async def publish(self, msgs: Iterable[Message]) -> int:
        """Keep each event (kind ``event``) in the event log and deliver it to
        every queue bound to its type; return the number of deliveries.

        An event whose ``id`` is already in the log is not delivered again
        (the outbox relay may publish twice).  Each delivery is a job of its
        own: a copy of the event with a new ``id``, the bound ``queue``, the
        binding's ``max_attempts``, and ``headers["event_id"]`` = the event's
        id.  Events published while no queue is bound are kept in the log only
        (``list_events`` + ``enqueue`` replays them).  Where
        ``capabilities.events`` is False this raises ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support events yet")

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        """``publish`` for sync callers, where ``capabilities.sync_enqueue``."""
        raise NotImplementedError(f"{type(self).__name__} has no sync publish path")

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        """Events of ``event_type`` kept in the log, published in ``[since, until]``,
        oldest first, one page at a time (pass the returned cursor back)."""
        raise NotImplementedError(f"{type(self).__name__} does not keep events")

    @abc.abstractmethod
    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        """Lease up to ``limit`` ready jobs from ``queues``.

        Each fetched job becomes ``running`` with its ``attempt`` counted up and
        a lease until now + ``lease``; no other fetch returns it while the lease
        holds.  Higher ``priority`` first, then oldest first, within a queue.
        Paused queues are skipped.  With nothing ready, block up to ``wait``
        seconds and return as soon as something is.  Cancelling a fetch leaves
        no job leased (a worker cancels its idle fetch when it stops).
        """

    @abc.abstractmethod
    async def ack(self, ds: Sequence[Delivery]) -> None:
        """Mark succeeded (keeping ``d.result`` for ``d.result_ttl`` s).  Safe to repeat;
        a delivery whose lease was lost is ignored."""

    @abc.abstractmethod
    async def retry(self, ds: Sequence[Delivery]) -> None:
        """Record ``d.error`` and make each job ready again at ``d.retry_at``."""

    @abc.abstractmethod
    async def dead(self, ds: Sequence[Delivery]) -> None:
        """Record ``d.error`` (if any) and move each job to the dead-letter queue,
        keeping every attempt's error."""

    @abc.abstractmethod
    async def requeue(self, ds: Sequence[Delivery]) -> None:
        """Give jobs back without charging the attempt (graceful shutdown, or a
        job held back by a rate or concurrency limit): ready again at
        ``d.retry_at``, or at once when that is in the past (or 0)."""

    @abc.abstractmethod
    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        """Heartbeat: push each lease to now + ``lease``; return the deliveries
        whose lease was already lost (rescued or taken by another worker)."""

    @abc.abstractmethod
    async def rescue(self) -> Rescued:
        """Return jobs whose lease expired to ``ready`` (recording a
        ``LeaseExpired`` error), or dead-letter those out of attempts.

        Returns how many were handled, as a ``Rescued`` (an int) whose ``dead``
        lists each job this call dead-lettered, with its queue, task name, the
        ``LeaseExpired`` error recorded last and its decoded envelope
        (``DeadLetter.message``: task name, args, kwargs, headers, attempt and
        every error, as ``get`` would show it).  An engine that finds lost
        leases elsewhere (a redelivery judged at fetch) and dead-letters a job
        there keeps that ``DeadLetter`` in memory and reports it (and counts
        it) at its next ``rescue()``, at most once per process that found it:
        the worker calls ``on_dead`` for every reported dead letter, as it does
        for the ones it dead-letters itself.  A report is best effort (a
        process that dies first loses it); the job itself is stored dead
        before it is reported.  Runs every second on every worker: a batch,
        costing nothing more when no lease expired."""

    # -- admin -----------------------------------------------------------

    @abc.abstractmethod
    async def stats(self) -> list[QueueStats]:
        """One row per known queue."""

    async def partition_lag(self) -> list[PartitionLag]:
        """Consumer lag per partition of each queue (``partitions.py``):
        engines whose queues are partitioned logs (Kafka) report it; the
        others have no partitions and report none."""
        return []

    @abc.abstractmethod
    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        """Jobs matching ``filter``, newest first, one page at a time."""

    @abc.abstractmethod
    async def get(self, id: str) -> JobInfo | None:
        """One job, or None if it is not stored (never was, or pruned)."""

    @abc.abstractmethod
    async def replay(self, filter: JobFilter) -> int:
        """Make dead jobs matching ``filter`` ready with fresh attempts, keeping
        their error history.  Only ``dead`` jobs are touched.  Returns the count."""

    @abc.abstractmethod
    async def purge(self, filter: JobFilter) -> int:
        """Delete jobs matching ``filter`` that are not running.  Returns the count."""

    @abc.abstractmethod
    async def cancel(self, ids: Sequence[str]) -> list[str]:
        """Cancel jobs that have not started; return the ids that were cancelled."""

    async def cancel_running(self, ds: Sequence[Delivery]) -> list[str]:
        """End jobs this worker holds (running, or fetched and not started) as
        ``cancelled``: someone asked to stop them while they ran
        (``dumbwaiter.cancel``).  Returns the ids that were cancelled; a job
        whose lease was lost is cancelled only if it has not started again.

        This default is two calls every engine has: ``requeue`` to a time far
        ahead (``CANCEL_PARK`` s: no worker can fetch it in between), then
        ``cancel``.  If the process dies between the two, the job runs again
        after the park, and its cancel request, still stored, stops it at that
        worker's first heartbeat.  An engine may do it in one step."""
        if not ds:
            return []
        at = time.time() + CANCEL_PARK
        for d in ds:
            d.retry_at = at
        await self.requeue(ds)
        return await self.cancel([d.id for d in ds])

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        """Move jobs that have not started (scheduled, ready, retrying) to run at
        ``at``; return the ids that moved (debounce pushes a burst's job back)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reschedule jobs")

    @abc.abstractmethod
    async def pause(self, queue: str) -> None:
        """Stop handing out jobs of ``queue`` (enqueue still works)."""

    @abc.abstractmethod
    async def resume(self, queue: str) -> None:
        """Undo ``pause``."""

    # -- coordination ------------------------------------------------------

    @abc.abstractmethod
    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        """Take the lock ``name`` for ``ttl`` s if free or expired (or already ours).

        Returns a fencing token that grows with every change of owner, or None
        when another owner holds it."""

    @abc.abstractmethod
    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        """Extend a held lock; False if it was lost (expired and taken)."""

    @abc.abstractmethod
    async def release(self, name: str, owner: str, token: int) -> None:
        """Give up a held lock (no-op if not held)."""

    # Small shared state (schedules' pause flags and last runs, workflow and
    # batch counters, kept results).  Keys are strings, values bytes; a ``ttl``
    # (seconds) makes the entry disappear after that long.

    @abc.abstractmethod
    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of those ``keys`` that exist (and have not expired)."""

    @abc.abstractmethod
    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        """Store (overwrite) every item."""

    @abc.abstractmethod
    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent; True if it was stored."""

    @abc.abstractmethod
    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        """Add ``amount`` to the integer at ``key`` (absent: 0) atomically; return
        the new value.  ``ttl`` is set when the key is created."""

    @abc.abstractmethod
    async def kv_delete(self, keys: Sequence[str]) -> int:
        """Delete ``keys``; return how many existed."""

    @abc.abstractmethod
    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        """Every live entry whose key starts with ``prefix``."""

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Read ``keys`` (as ``kv_get``), let ``decide`` say what to store
        given what it read, store that (as ``kv_set``) and return
        ``decide``'s other result: a read-modify-write of many keys.

        Each value ``decide`` returns is the bytes to store, kept with no
        expiry (replacing any the key had), or a ``(bytes, ttl)`` tuple: kept
        ``ttl`` seconds from the write, as ``kv_set(..., ttl=)`` keeps it
        (``None``: no expiry).  A ttl per key, not per call, because what to
        keep and for how long are decided together, on what was read: the
        RabbitMQ broker's ``cancel`` keeps each cancelled record until its
        queued copy has come up (its due time, read in the update, plus the
        retention), and an ``ack`` of a batch keeps each record and its unique
        key's entry as long as its own result.

        ``decide`` is pure (no I/O, no awaits, no shared state it changes) and
        may run more than once or on another thread.  Every engine of this
        package makes the update atomic against other ``kv_update`` calls:
        none that shares a key comes in between its read and its write (the
        conformance suite checks it), so none is lost.  Against plain writes
        (``kv_set``, ``kv_add``...) of a key it reads and writes, it never
        stores a decision made before that write.  How: one transaction
        (SQLite, PostgreSQL), the store's lock (memory), a compare-and-set of
        every key read, run again on a change (Redis), key locks and per-key
        compare-and-set (NATS, where a reader may see an update half applied:
        see its method).  This default, for other engines, is a ``kv_get``
        then a ``kv_set``: another writer may come in between."""
        got = await self.kv_get(keys)
        writes, out = decide(got)
        by_ttl: dict[float | None, dict[str, bytes]] = {}
        for k, v in writes.items():
            data, ttl = kv_write(v)
            by_ttl.setdefault(ttl, {})[k] = data
        for ttl, items in by_ttl.items():
            await self.kv_set(items, ttl)
        return out

    async def kv_update_known(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
        known: Mapping[str, bytes | None],
    ) -> T:
        """``kv_update``, where the caller believes it knows what ``keys``
        hold (``known``: a value, or None for an absent key), because it
        wrote them itself (a worker settling the record it leased).  An
        engine that compares every key read before it writes (Redis) may
        decide on ``known`` first and skip its read: a right belief costs
        one round trip instead of two, a wrong one is caught by the compare,
        and the update reads and decides again, as ``kv_update`` does.  The
        result is the same as ``kv_update``'s either way; this default is
        ``kv_update``."""
        return await self.kv_update(keys, decide)

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        """Add ``member`` to the set ``key`` (idempotent) and return the set's size
        after the add, counting every member added before: the call that adds
        the last member always sees the full size (a chord's last member fires
        its callback).  Concurrent callers may both see it, so callers act
        idempotently (a deterministic job id).

        This default builds the set from ``kv_add`` and ``kv_scan``; engines
        override it with a native atomic set (memory and SQLite give each
        concurrent add its own size)."""
        await self.kv_add(f"{key}\x1f{member}", b"1", ttl)
        return len(await self.kv_scan(f"{key}\x1f"))

    async def kv_smembers(self, key: str) -> set[str]:
        """The members of the set ``key`` (see ``kv_sadd``; empty if absent)."""
        return {k.split("\x1f", 1)[1] for k in await self.kv_scan(f"{key}\x1f")}

    async def server_time(self) -> float | None:
        """The server's wall clock now (Unix seconds), for an engine whose
        times live in this one (RabbitMQ's state store; ``clock.py``).  None
        where there is no server clock to read: the memory store and SQLite
        are one machine's, whose processes share its clock."""
        return None

    # Flow control, cluster-wide (where ``capabilities.limits``).

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        """Take the permit of ``key`` stamped ``at`` (the job's start time, by the
        worker's clock): allowed when, with it, no window of ``per`` seconds
        holds more than ``rate`` permits (``flow.window_wait`` is the rule,
        exact even when permits arrive out of order).  Returns 0.0 when taken,
        else the seconds until one would be (and takes nothing)."""
        raise NotImplementedError(f"{type(self).__name__} has no rate limits")

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        """Take one of ``limit`` slots of ``key`` for ``holder`` (e.g. a job id)
        for ``ttl`` seconds; True if taken (or already held by ``holder``).
        Expired holds free their slot, so a crashed worker cannot keep one."""
        raise NotImplementedError(f"{type(self).__name__} has no concurrency limits")

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        """Push the expiry of each (key, holder) hold to now + ``ttl`` (heartbeat)."""
        raise NotImplementedError(f"{type(self).__name__} has no concurrency limits")

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        """Give (key, holder) holds back (no-op for holds not held)."""
        raise NotImplementedError(f"{type(self).__name__} has no concurrency limits")


class StateDelegation(Broker):
    """An engine whose coordination lives in another broker, its *state
    store* (RabbitMQ's and Kafka's ``state=``): a transport with no
    key-value part of its own.  Locks, the key-value store and the limits
    are the state store's, forwarded here once rather than by each engine.

    A subclass sets ``self.state`` in ``__init__`` (it may swap it later:
    RabbitMQ puts a gate there until the vhost agrees the store is the
    app's)."""

    state: Broker

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        return await self.state.acquire(name, owner, ttl)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        return await self.state.renew(name, owner, token, ttl)

    async def release(self, name: str, owner: str, token: int) -> None:
        await self.state.release(name, owner, token)

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        return await self.state.kv_get(keys)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        await self.state.kv_set(items, ttl)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        return await self.state.kv_update(keys, decide)

    async def kv_update_known(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
        known: Mapping[str, bytes | None],
    ) -> T:
        return await self.state.kv_update_known(keys, decide, known)

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return await self.state.kv_add(key, value, ttl)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        return await self.state.kv_incr(key, amount, ttl)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        return await self.state.kv_delete(keys)

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        return await self.state.kv_scan(prefix)

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        return await self.state.kv_sadd(key, member, ttl)

    async def kv_smembers(self, key: str) -> set[str]:
        return await self.state.kv_smembers(key)

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        return await self.state.rate_limit(key, rate, per, at)

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        return await self.state.slot_acquire(key, limit, holder, ttl)

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        await self.state.slot_extend(holds, ttl)

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        await self.state.slot_release(holds)


#: the seam's public methods: what ``Broker.__init_subclass__`` wraps
SEAM = frozenset(
    name
    for name, value in vars(Broker).items()
    if not name.startswith("_") and inspect.isfunction(value) and name != "failure"
)


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its client library's exceptions turned into ``BrokerError``
    (see ``Broker``); dumbwaiter's own errors pass as they are."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(self: Broker, *args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(self, *args, **kwargs)
            except DumbwaiterError:
                raise
            except self.client_errors as exc:
                raise self.failure(exc) from exc

        guarded: Callable[..., Any] = guarded_async
    else:

        @functools.wraps(fn)
        def guarded_sync(self: Broker, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except DumbwaiterError:
                raise
            except self.client_errors as exc:
                raise self.failure(exc) from exc

        guarded = guarded_sync
    guarded._dw_guarded = True  # type: ignore[attr-defined]
    return guarded
