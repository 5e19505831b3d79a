"""The data the broker seam passes (brokers/base.py): what an engine offers
(``Capabilities``), a fetched job and its lease (``Delivery``), an event
binding (``Binding``), dead letters found by a broker (``DeadLetter``,
``Rescued``), what the admin part reports (``QueueStats``, ``JobInfo``,
``Page``) and addresses (``JobFilter``), and the helpers every engine
builds them with.  Plain data: it imports nothing of the seam, so engines,
the worker and the admin layers can use it without the ``Broker`` class.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..message import ErrorRecord, Message
from ..state import State


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine offers; the layers above branch on these flags only."""

    #: ``eta``/``delay`` kept by the engine (not by a worker's memory)
    native_delay: bool = True
    #: ``priority`` orders ready jobs within a queue
    priorities: bool = True
    #: idle ``fetch`` blocks on the engine and wakes on enqueue (no busy polling)
    blocking_fetch: bool = True
    #: jobs can be written inside the caller's own database transaction
    transactional_outbox: bool = False
    #: ``enqueue_sync`` exists: sync producers need no event loop or thread hop
    sync_enqueue: bool = False
    #: several worker processes may share the broker safely
    multi_process: bool = True
    #: processes on other machines may share it too: every process on every
    #: host that names this broker sees one truth (jobs, records, locks,
    #: limits, unique keys).  False by default: an engine claims it.  SQLite
    #: and memory: no (one machine, one process); Redis, PostgreSQL, NATS:
    #: yes; RabbitMQ: its state store's (on SQLite, one machine)
    multi_host: bool = False
    #: results of tasks with ``keep_result`` can be stored
    results: bool = True
    #: largest message the engine accepts (None: no limit of its own)
    max_message_size: int | None = None
    #: ``publish`` fans events out to bound queues and keeps them for replay
    events: bool = False
    #: events with the same ``key`` reach a group's handler one at a time, in order
    ordered_keys: bool = False
    #: cluster-wide flow control: ``rate_limit`` and ``slot_*`` (concurrency limits)
    limits: bool = False
    #: ``enqueue_bounded`` counts and stores in one atomic step of the engine
    #: (a transaction, a script); without it, producers of a bounded queue
    #: take a lock per queue around the count (brokers/capacity.py): the
    #: bound holds as well, at a round trip or three more per enqueue
    native_capacity: bool = False
    #: fetches a worker may keep in flight at once: ``fetch`` is safe to call
    #: again before the last call returned, and a second claim sent during
    #: the first's round trip pays off (the worker runs one claim loop each)
    concurrent_fetches: int = 1


@dataclass(slots=True)
class Delivery:
    """A fetched message and the lease that makes this worker its owner.

    ``message`` is None when the stored body could not be decoded; then
    ``decode_error`` says why and ``raw`` holds the body, so the worker can
    dead-letter it with its reason instead of crashing.
    """

    id: str
    message: Message | None
    token: Any
    lease_until: float
    queue: str = ""
    raw: bytes | None = None
    decode_error: str | None = None
    #: the worker found this event already handled by its group (inbox): ack only
    duplicate: bool = False
    #: the event's broker-side inbox entry, which its ack marks (the worker
    #: works it out once, at fetch: ``settle.inbox_key``; None for a task)
    inbox: str | None = None
    #: (key, holder) concurrency slots the worker holds for this job
    holds: list[tuple[str, str]] = field(default_factory=list)
    #: when the worker started it (the time its rate permit is stamped with)
    started_at: float = 0.0
    # outcome, written by the worker before ack / retry / dead
    result: bytes | None = None
    result_ttl: float | None = None
    error: ErrorRecord | None = None
    retry_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Binding:
    """Events of type ``pattern`` are delivered to ``queue`` (a subscriber
    group's queue), each delivery with ``max_attempts`` (the group's retry
    policy).  Patterns are exact event types for now."""

    pattern: str
    queue: str
    max_attempts: int = 4


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job the broker dead-lettered on its own, not on a worker's ``dead``
    call: its lease ran out on its last attempt (its worker died or hung).

    No worker saw that outcome, so the rescuer reports it (``on_dead``
    middleware, the dead-letter metric) from ``rescue()``'s result.  It carries
    what the hooks label by (queue, task name), the error that ended it, and
    the job's stored envelope as it now is (``message``): the hooks users
    write on ``on_dead`` (alerting, logging the arguments) need the real
    task, arguments and headers, not a stub rebuilt from the id and name.
    Dead letters are rare, so loading their bodies costs a rescue nothing
    on the usual call, which finds none."""

    id: str
    queue: str
    name: str
    #: the ``LeaseExpired`` error the broker recorded as the job's last
    error: ErrorRecord
    #: the decoded envelope as stored dead (args, kwargs, headers, the
    #: attempt that was lost, every error ending with ``error``); None only
    #: when the stored body does not decode (then the worker reports a stub
    #: built from the fields above)
    message: Message | None = None


class Rescued(int):
    """What ``rescue()`` returns: the number of jobs it handled (it *is* that
    int, so callers that only count keep working) plus ``dead``, the jobs among
    them that went to the dead-letter queue, and any the broker dead-lettered
    by itself since its last ``rescue()`` (see ``Broker.rescue``)."""

    dead: tuple[DeadLetter, ...]

    def __new__(cls, count: int = 0, dead: Iterable[DeadLetter] = ()) -> Rescued:
        self = super().__new__(cls, count)
        self.dead = tuple(dead)
        return self

    def __repr__(self) -> str:
        return f"Rescued({int(self)}, dead={list(self.dead)!r})"


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's counts.

    A broker's ``stats()`` counts every leased job as ``running``: it only
    knows leases.  ``metrics.queue_stats`` (what ``dumbwaiter stats``, the
    dashboard and the gauges show) splits them with the workers' own
    counts: ``running`` a handler is executing, ``prefetched`` leased by a
    worker and waiting in its buffer for a free slot.
    """

    queue: str
    ready: int = 0
    #: waiting for an eta (retries not included)
    scheduled: int = 0
    #: failed at least once, waiting for the next attempt
    retrying: int = 0
    #: leased jobs a handler runs (a broker's own ``stats()``: every leased job)
    running: int = 0
    dead: int = 0
    succeeded: int = 0
    cancelled: int = 0
    #: age in seconds of the oldest ready job (0 when none is ready)
    lag: float = 0.0
    paused: bool = False
    #: leased by a worker, not started yet (its prefetch buffer): the workers'
    #: count at their last heartbeat; 0 in a broker's own ``stats()``
    prefetched: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "retrying": self.retrying,
            "running": self.running,
            "prefetched": self.prefetched,
            "dead": self.dead,
            "succeeded": self.succeeded,
            "cancelled": self.cancelled,
            "lag": self.lag,
            "paused": self.paused,
        }


@dataclass(slots=True)
class JobInfo:
    """A stored job as the admin part sees it: the envelope plus where it is."""

    message: Message
    state: State
    #: when it becomes (or became) ready: eta, or the time of its next retry
    run_at: float | None = None
    #: when it entered its current state
    updated_at: float | None = None
    worker: str | None = None
    lease_until: float | None = None
    #: JSON bytes of the worker's record of its successful attempt (see ``outcome``)
    result: bytes | None = None
    #: times it was replayed from the dead-letter queue
    replays: int = 0
    raw: bytes | None = None
    #: a succeeded task without ``keep_result``: only its id, task, queue,
    #: state and times were kept, no args, kwargs, headers or errors (finished.py)
    compact: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = self.message.to_dict()
        d.update(
            state=str(self.state),
            run_at=self.run_at,
            updated_at=self.updated_at,
            worker=self.worker,
            lease_until=self.lease_until,
            replays=self.replays,
        )
        if self.compact:
            d["compact"] = True
        done = self.outcome()
        if "value" in done:
            d["result"] = done["value"]
        elif "error" in done:
            d["result_error"] = done["error"]
        for k in ("started", "finished"):
            if isinstance(done.get(k), (int, float)):
                d[k + "_at"] = done[k]
        return d

    def outcome(self) -> dict[str, Any]:
        """The worker's record of the job's successful attempt (``result``):
        ``started`` and ``finished`` (epoch seconds), and ``value`` (the
        result, when the task keeps results) or ``error`` (why a result could
        not be kept).  Empty when there is none (not succeeded yet, or stored
        by an older version), and for a record that does not decode."""
        if self.result is None:
            return {}
        from ..message import loads

        try:
            stored = loads(self.result)
        except ValueError:
            return {}
        return stored if isinstance(stored, dict) else {}


def stats_rows(
    counts: Mapping[str, Mapping[str, float]], paused: Container[str]
) -> list[QueueStats]:
    """``stats()``'s answer from per-queue counts: state value -> jobs, plus an
    optional ``"lag"`` (seconds, never reported below 0); queues by name."""
    return [
        QueueStats(
            queue=q,
            ready=int(c.get("ready", 0)),
            scheduled=int(c.get("scheduled", 0)),
            retrying=int(c.get("retrying", 0)),
            running=int(c.get("running", 0)),
            dead=int(c.get("dead", 0)),
            succeeded=int(c.get("succeeded", 0)),
            cancelled=int(c.get("cancelled", 0)),
            lag=max(0.0, float(c.get("lag", 0.0))),
            paused=q in paused,
        )
        for q, c in sorted(counts.items())
    ]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs an admin call addresses.  Every field narrows; empty = all.

    ``since``/``until`` bound ``updated_at`` (for dead letters: when they
    died).  ``error_type`` matches the exception type of the last error, by
    its short name (``TimeoutError``) or qualified name.

    ``key`` matches ``Message.key`` exactly: a task's unique key (also after a
    newer job took the key over, while the old job is still stored) or the
    ordering key an event's deliveries carry.  Every broker answers it exactly
    over every stored job, never over a "newest N" window: SQLite and
    PostgreSQL by an index of every job's message key, Redis by a scan that
    reads only bodies containing the key's JSON text, RabbitMQ and NATS over
    the records every listing reads (see each broker's docs for what it
    costs).
    """

    queue: str | None = None
    name: str | None = None
    state: State | None = None
    error_type: str | None = None
    since: float | None = None
    until: float | None = None
    ids: tuple[str, ...] | None = None
    key: str | None = None

    def matches(self, info: JobInfo) -> bool:
        """The reference semantics, used by the memory broker and by tests."""
        m = info.message
        if self.queue is not None and m.queue != self.queue:
            return False
        if self.name is not None and m.name != self.name:
            return False
        if self.state is not None and info.state != self.state:
            return False
        if self.ids is not None and m.id not in self.ids:
            return False
        if self.key is not None and m.key != self.key:
            return False
        t = info.updated_at or 0.0
        if self.since is not None and t < self.since:
            return False
        if self.until is not None and t > self.until:
            return False
        if self.error_type is not None:
            if not m.errors:
                return False
            return error_type_matches(m.errors[-1].type, self.error_type)
        return True


def delivery_of(event: Message, binding: Binding, id: str) -> Message:
    """The job that delivers ``event`` to one bound queue (see ``Broker.publish``)."""
    return Message(
        id=id,
        kind=event.kind,
        name=event.name,
        queue=binding.queue,
        payload=event.payload,
        headers={**event.headers, "event_id": event.id},
        max_attempts=binding.max_attempts,
        created_at=event.created_at,
        eta=event.eta,
        priority=event.priority,
        key=event.key,
    )


def error_type_matches(recorded: str, wanted: str) -> bool:
    """A short name (``TimeoutError``) matches any module's class of that name; a
    qualified one matches exactly.  Built-ins are recorded by their bare name,
    so ``builtins.ValueError`` is read as ``ValueError``."""
    wanted = normalize_error_type(wanted)
    return recorded == wanted or recorded.rsplit(".", 1)[-1] == wanted


def normalize_error_type(name: str) -> str:
    return name.removeprefix("builtins.")


@dataclass(slots=True)
class Page:
    """One page of a listing; pass ``cursor`` back to get the next one."""

    items: list[JobInfo] = field(default_factory=list)
    cursor: str | None = None


def events_page(
    logged: Iterable[tuple[float, Message]],
    since: float | None,
    until: float | None,
    cursor: str | None,
    limit: int,
) -> tuple[list[Message], str | None]:
    """``list_events``'s page from an event log read whole, as (publish
    time, event) pairs: the events published in [since, until] after
    ``cursor``, in id order, and the next page's cursor (None: the last).
    For the engines whose log cannot be queried by time and id (memory,
    RabbitMQ's state store, a Kafka topic)."""
    found = sorted(
        (m for at, m in logged
         if (since is None or at >= since)
         and (until is None or at <= until)
         and (cursor is None or m.id > cursor)),
        key=lambda m: m.id,
    )  # fmt: skip
    return found[:limit], (found[limit - 1].id if len(found) > limit else None)
