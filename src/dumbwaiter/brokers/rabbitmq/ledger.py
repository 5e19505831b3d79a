"""The job index kept in the companion state store, and how a copy is
judged against it (the records: ``brokers/record.py``, shared with Kafka).

RabbitMQ holds messages, not a searchable index: it cannot say where job
``X`` is, list dead jobs by error type, or tell a stale copy from the current
one.  So every job has a record in the state store (any dumbwaiter broker,
through its key-value seam; its keys: ``topology.Keys``): the envelope, its
state, a version that grows with each copy of it sent to RabbitMQ, and the
fencing token of its current lease.  A copy that arrives with an older
version than its record is stale (retried, rescued, rescheduled or
cancelled since) and is dropped (``RabbitMQLedger._judge``).

Writes that follow a read compare first: ``_write_if_unchanged`` writes a record only if
it is still the one read (its ``stamp_of``), so an admin call, a rescue or
an outcome cannot clobber a lease, cancel or retry that came in between.
``RabbitMQLedger`` also builds the copies every part sends (``_copy``,
``_copy_delayed_until``, ``_dead_copy``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pamqp import commands as spec

from ...errors import MessageDecodeError
from ...message import EVENT, TASK, Message, decode, encode, uuid7
from ...state import FINAL_STATES, State
from .. import transitions as T
from ..base import KvWrite
from ..record import Record, delivery_id
from ..types import Binding, Delivery
from . import topology as topo
from .connection import RabbitMQConnection
from .link import Raw

#: seconds a copy newer than its record waits for the record to be written
RECORD_GRACE = 5.0
#: seconds a first-seen copy without its record may wait in the worker
#: (``transport._wait_for_record``), judged again after a growing pause, before it goes
#: to the delay cascade (``topology.UNIT`` and more): a producer writes a
#: job's record while RabbitMQ stores its copy, and a worker may see the
#: copy a moment before the record's commit
LOCAL_GRACE = 0.05
#: rounds of a unique key or a cancel whose key changed hands between a read
#: and its update, before the call gives up (each is another caller's win)
KEY_ROUNDS = 20
#: what ``_judge`` decides about a copy RabbitMQ handed out
TAKE, DROP, PARK, DEAD = "take", "drop", "park", "dead"
#: and what the admission decides before: its queue is paused; a fanned-out
#: event without a record, whose group's binding must be read first
REQUEUE, BIND = "requeue", "bind"
#: no record yet for a first-seen copy: judged again in a moment (``LOCAL_GRACE``)
WAIT = "wait"
Verdict = tuple[str, "Record | None"]
#: what tells one record of a job from the next: its version (a new copy, a
#: cancel), its fencing token (a lease), its state (an ack) and its lease's
#: end (a heartbeat: a rescue of the lease it read must lose to it)
Stamp = tuple[int, int, str, float]


@dataclass(slots=True)
class AckOnAdmission:
    """An ack's planned records (key: (the stamp of the lease held, the
    record with its ttl)), waiting for this link's next admission to write
    them in its ``kv_update`` (``RabbitMQOutcomes._ack_with_admission``)."""

    planned: dict[str, tuple[Stamp, KvWrite]]
    ids: set[str]
    done: asyncio.Future[None]
    taken: bool = False


@dataclass(frozen=True, slots=True)
class Token:
    """A delivery's fencing token (the record's) and its AMQP message."""

    record: int
    gen: int
    tag: int


def _first_seen(raw: Raw, now: float) -> float:
    """When a parked copy was first seen (``dw-seen``, a decimal string; a
    float from an older version, 32 bits wide, is read as it is), or ``now``."""
    value = raw.headers.get("dw-seen")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        return now if value is None else float(value)
    except (TypeError, ValueError):
        return now


def _enq_of(raw: Raw) -> str | None:
    """The token of the enqueue that sent a copy (``dw-e``), if it carries one."""
    return _text_header(raw, "dw-e")


def _text_header(raw: Raw, name: str) -> str | None:
    """A header of text, whichever AMQP string type carried it; None when it
    is absent or of another type (a message put on the queue by hand)."""
    value = raw.headers.get(name)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _ver_of(raw: Raw) -> int:
    """A copy's version (``dw-v``); 0 when it carries none, or one that is not
    a number (a message put on the queue by hand must not fail the fetch)."""
    value = raw.headers.get("dw-v", 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _other_enqueue(copy: str | None, record: str | None) -> bool:
    """Whether a copy is another enqueue's than its record's: only when both
    carry an enqueue token and they differ.  A copy without one was sent by
    a rescue, a retry, an admin call or a version before the tokens; a
    record without one was written (or rewritten, by a lease or an outcome)
    by such a version: a worker of it drops the field.  Either way the
    version alone judges the copy, as before the tokens: during a rolling
    upgrade, the original copy of a job an older worker leased and lost
    must still run, and a losing duplicate of an id whose record has no
    token may run with its own arguments, as it did then."""
    return copy is not None and record is not None and copy != record


def _may_wait(raw: Raw, now: float) -> bool:
    """Whether a copy without its record may wait in the worker (``WAIT``)
    rather than in the cascade: one a consumer handed over, never parked
    before, within ``LOCAL_GRACE`` of its first wait."""
    return (
        raw.can_wait
        and "dw-seen" not in raw.headers
        and (raw.waited_since == 0.0 or now - raw.waited_since < LOCAL_GRACE)
    )


def parse_copies(
    raws: list[Raw], lease_until: float
) -> tuple[list[tuple[Raw, Message, str, Message | None]], list[Delivery]]:
    """Decode copies: (raw, message, job id, the event if it is a fanned-out
    one), and deliveries of the undecodable ones for the worker to dead-letter."""
    parsed: list[tuple[Raw, Message, str, Message | None]] = []
    bad: list[Delivery] = []
    for raw in raws:
        try:
            m = decode(raw.body)
        except MessageDecodeError as exc:
            replayed = _text_header(raw, "dw-raw")
            bad.append(
                Delivery(
                    # the record of a dead letter a replay put back, or a new
                    # one's; never the AMQP message id, which may be a job's
                    # (a damaged copy of it) whose record must stay its own
                    id=replayed or uuid7(),
                    message=None,
                    token=Token(_ver_of(raw) if replayed else 0, raw.gen, raw.tag),
                    lease_until=lease_until,
                    queue=raw.queue,
                    raw=raw.body,
                    decode_error=str(exc),
                )
            )
            continue
        if m.kind == EVENT and not m.queue:  # a fanned-out event
            parsed.append((raw, m, delivery_id(m.id, raw.queue), m))
        else:
            parsed.append((raw, m, m.id, None))
    return parsed, bad


def _judge_unrecorded(raw: Raw, m: Message, ver: int, now: float) -> Verdict:
    """``_judge`` of a copy without a record (nor a tombstone): its enqueue
    is between the publish and a failed compensation, or the state store
    lost it (a crash of a store that does not sync every commit).  Wait a
    moment for it; then the copy, which RabbitMQ confirmed, is the truth."""
    seen = _first_seen(raw, now)
    if now - seen < RECORD_GRACE:
        if _may_wait(raw, now):
            return WAIT, None
        return PARK, Record(msg=m, state=State.SCHEDULED, run_at=now + topo.UNIT)
    return TAKE, Record(
        msg=m, state=State.READY, ver=ver, run_at=now, updated_at=now, enq=_enq_of(raw)
    )


def _judge_ahead(raw: Raw, m: Message, rec: Record, ver: int, now: float) -> Verdict | None:
    """``_judge`` of a copy newer than its record: a verdict, or None when the
    copy wins (``rec`` is then its job's record as the copy makes it).

    A copy sent before its record is written (the writer publishes first,
    so a crash in between loses nothing): wait for the record, whatever
    state it is in now (``replay`` publishes while the record still says
    dead; dropped as a dead job's, its copy left the replayed record ready
    with no copy to serve it).  If the record never comes, its writer died,
    and the copy wins over a waiting record or a dead one (the replay's),
    but never over a live lease or a finished job: an admin call or a
    rescue whose record write found the job leased since its read
    (``_write_if_unchanged``) leaves such a copy behind, and it waits the lease out (the
    job is then done, and the copy dropped; or retried, rescued or its
    lease lost, and the copy stale, a twin or the winner)."""
    seen = _first_seen(raw, now)
    if now - seen < RECORD_GRACE:
        if _may_wait(raw, now):
            return WAIT, None
        rec.state, rec.run_at = State.SCHEDULED, now + topo.UNIT
        return PARK, rec
    if rec.state in (State.SUCCEEDED, State.CANCELLED):
        return DROP, None
    if rec.state is State.RUNNING and rec.lease_until > now:
        return PARK, rec
    rec.ver, rec.msg = ver, m
    rec.state, rec.run_at = State.READY, now
    return None


def stamp_of(rec: Record) -> Stamp:
    return rec.ver, rec.token, rec.state.value, rec.lease_until


def still_unchanged(
    planned: Mapping[str, tuple[Stamp, bytes]], got: Mapping[str, bytes]
) -> dict[str, bytes]:
    """The planned records (key: (the read record's stamp, the new record))
    whose stored record ``got`` still has the stamp read."""
    writes: dict[str, bytes] = {}
    for key, (old, new) in planned.items():
        raw = got.get(key)
        if raw is not None and _stamp_raw(raw) == old:
            writes[key] = new
    return writes


def still_held(
    planned: Mapping[str, tuple[Stamp, KvWrite]], got: Mapping[str, bytes]
) -> dict[str, KvWrite]:
    """The planned outcomes (key: (the stamp of the record whose lease the
    worker held, what to write)) whose stored record still holds that lease:
    the same version, fencing token and state.  An outcome is written only
    there: its worker may trust its lease without a read (``SURE``), and the
    write may be held up past the lease's end (a host cut off from the
    network: TCP delivers it when the link is back), after the job was
    rescued and run again.  The lease's end is not compared: a heartbeat of
    the same lease may have moved it since, and an outcome must not lose to
    its own worker's heartbeat."""
    writes: dict[str, KvWrite] = {}
    for key, (old, new) in planned.items():
        raw = got.get(key)
        if raw is not None and _stamp_raw(raw)[:3] == old[:3]:
            writes[key] = new
    return writes


def _stamp_raw(raw: bytes) -> Stamp:
    """``stamp_of`` of a stored record without parsing its envelope."""
    d = orjson.loads(raw)
    return int(d["v"]), int(d["t"]), str(d["s"]), float(d.get("l") or 0.0)


class RabbitMQLedger(RabbitMQConnection):
    """The records' side of every part: the copies they send, the compared
    writes, the judgement of a copy (the module's doc)."""

    def _copy(
        self,
        msg: Message,
        ver: int,
        run_at: float,
        body: bytes | None = None,
        enq: str | None = None,
    ) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """How to send one copy of a job: straight into its lane, or through the
        delay cascade when ``run_at`` is ahead.  ``enq``: the token of the
        enqueue that writes its record meanwhile (``dw-e``, see ``_judge``)."""
        lane = topo.lane_of(msg.priority)
        target = self.names.lane(msg.queue, lane)
        props = spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_id=msg.id,
            headers={"dw-v": ver} if enq is None else {"dw-v": ver, "dw-e": enq},
        )
        raw = encode(msg) if body is None else body
        units = topo.delay_units(run_at - self.clock.now())
        if units > 0:
            return self.names.level(topo.LEVELS - 1), topo.delay_key(units, target), raw, props
        return "", target, raw, props

    def _copy_delayed_until(
        self, raw: Raw, until: float
    ) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """Send a copy as it came back into the cascade until ``until``."""
        lane_queue = self.names.lane(raw.queue, raw.lane)
        units = max(1, topo.delay_units(until - self.clock.now()))
        props = spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_id=raw.message_id or None,
            headers={
                # a string: AMQP tables carry a Python float as a 32-bit float,
                # which is up to a minute off at today's epoch (_first_seen)
                "dw-seen": f"{self.clock.now():.6f}",
                **{k: v for k, v in raw.headers.items() if k.startswith("dw-")},
            },
        )
        key = topo.delay_key(units, lane_queue)
        return self.names.level(topo.LEVELS - 1), key, raw.body, props

    def _dead_copy(
        self, msg: Message | None, queue: str, body: bytes | None = None
    ) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A dead letter for the DLQ: the whole envelope in the body, the error
        history (without tracebacks) in headers for people reading the DLQ."""
        headers: dict[str, Any] = {}
        if msg is not None:
            errs = msg.errors
            headers["x-dw-attempts"] = msg.attempt
            headers["x-dw-errors"] = orjson.dumps(
                [
                    {"attempt": e.attempt, "type": e.type, "message": e.message[:500]}
                    for e in errs[-20:]
                ]
            ).decode()
            if errs:
                headers["x-dw-error-type"] = errs[-1].type
                headers["x-dw-error-message"] = errs[-1].message[:1000]
        props = spec.Basic.Properties(
            content_type="application/json" if body is None else None,
            delivery_mode=2,
            message_id=None if msg is None else msg.id,
            headers=headers,
        )
        raw = body if body is not None else (encode(msg) if msg is not None else b"")
        return self.names.dlx, queue, raw, props

    def _raw_copy(self, rec: Record) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A copy of an undecodable message's record (``Record.raw``): its
        body as it came, to its queue's main lane, naming its record
        (``dw-raw``) and version: a worker that cannot decode it again
        dead-letters it under that record, not as a new one."""
        assert rec.raw is not None
        props = spec.Basic.Properties(
            delivery_mode=2,
            message_id=rec.msg.id,
            headers={"dw-v": rec.ver, "dw-raw": rec.msg.id},
        )
        return "", self.names.lane(rec.msg.queue), rec.raw, props

    def _copy_of(self, rec: Record, run_at: float) -> tuple[str, str, bytes, spec.Basic.Properties]:
        """A new copy of ``rec``'s job at its version, due at ``run_at``."""
        if rec.raw is not None:
            return self._raw_copy(rec)
        return self._copy(rec.msg, rec.ver, run_at)

    async def _load_bindings(self) -> list[Binding]:
        found = await self.state.kv_scan(self.keys.binding)
        out = []
        for k, v in found.items():
            queue, pattern = k[len(self.keys.binding) :].split("\x1f", 1)
            out.append(Binding(pattern, queue, int(v)))
        self._bindings = out
        return out

    def _entry_of(self, rec: Record) -> str | None:
        """The state-store key of the unique key ``rec``'s job was enqueued
        with (tasks only), whoever holds it now; None without one."""
        if rec.msg.key is None or rec.msg.kind != TASK:
            return None
        return self.keys.key + rec.msg.key

    async def _write_if_unchanged(self, planned: Mapping[str, tuple[Stamp, bytes]]) -> list[str]:
        """Write each planned record (key: (the read record's ``stamp_of``, the
        new record)) only if the record is still the one read, in one
        ``kv_update`` (atomic on a SQLite state store): an admin call's
        read-then-write can no longer clobber a lease, cancel, retry, rescue
        or purge that came in between.  The keys written, in order.

        ``decide`` only parses what it was given: pure, safe to run twice."""

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
            writes = still_unchanged(planned, got)
            return writes, list(writes)

        return await self.state.kv_update(list(planned), decide)

    def _judge(
        self,
        raw: Raw,
        m: Message,
        did: str,
        ev: Message | None,
        got: Mapping[str, bytes],
        now: float,
    ) -> tuple[str, Record | None]:
        """What to do with one copy: ``TAKE`` (run it), ``DROP`` (stale: its
        job was retried, rescued, rescheduled, cancelled, purged or finished
        since), ``PARK`` (its job is leased to a live worker, or not due) or
        ``DEAD`` (its worker died holding the last attempt).  A fanned-out
        event without a record (its publisher knew no binding) is the
        caller's: it needs the binding, read from the state store."""
        k = self.keys
        rec_raw = got.get(k.job + did)
        ver = _ver_of(raw)
        if rec_raw is None:
            if k.claim + "gone:" + did in got:
                return DROP, None  # purged: its tombstone outlives its copies
            return _judge_unrecorded(raw, m, ver, now)
        rec = Record.load(rec_raw, None if ev is not None else m, ver)
        if _other_enqueue(_enq_of(raw), rec.enq):
            return DROP, None  # another enqueue's copy: that one's record won
        if ver < rec.ver:
            return DROP, None
        if ver > rec.ver:
            # judged before the state: a replay's copy is sent while its
            # record still says dead, and must wait for the record
            ahead = _judge_ahead(raw, m, rec, ver, now)
            if ahead is not None:
                return ahead
        elif rec.state in FINAL_STATES:
            return DROP, None
        if rec.state is State.RUNNING:
            if not raw.redelivered and "dw-seen" not in raw.headers:
                return DROP, None  # a copy sent twice (a publish tried again)
            if rec.lease_until > now:
                return PARK, rec  # its worker's connection closed: wait out the lease
            # its worker's connection died and its lease ran out: this copy,
            # still the current one, takes the job over (``T.take_lease``)
            if T.lose_lease(rec, now, "lost its connection") is State.DEAD:
                return DEAD, rec
            return TAKE, rec
        if rec.run_at > now + 0.001:
            return PARK, rec  # early: not due yet
        return TAKE, rec
