"""What each call does to the job records, and the copies it writes.

Each change is one ``kv_update`` of the state store (atomic against every
other process), decided by a pure function over the records read; the
copies the change calls for are written to Kafka after it is stored, so a
worker never reads a copy of a changed job before its record.

An enqueue is the exception: it writes a new job's record *while* its copy
is sent (``enqueue``), so it takes the longer of the two, not their sum, and
a worker may read the copy first.  A copy without a record, of version 0
and younger than ``record_grace`` (on the state store's clock, from its
``dw-t``), waits in the worker and is judged again (``judge``); past that
it is dropped: its enqueue failed (the call raised) or its record is gone.
A producer whose record write ended later than half the grace sends the
copy again, so a copy dropped while its record was still on its way never
loses a job whose enqueue returned.  A copy whose record moved on since (a
newer version, a final state) is dropped when it is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from ...errors import BrokerError
from ...message import GROUP_PREFIX, TASK, Message, encode
from ...state import FINAL_STATES, State
from .. import transitions as T
from ..base import KvWrite, kv_write
from ..finished import compacts
from ..types import DeadLetter, Delivery, Rescued, delivery_of
from . import foreign
from .belief import Beliefs, believed
from .engine import KafkaEngine
from .foreign import foreign_id, origin
from .produce import Sending
from .records import SETTLED, SETTLED_TTL, WAITING, Record, delivery_id
from .transport import Copy

log = logging.getLogger("dumbwaiter.kafka")

#: header "unique" -> the states in which a key's holder blocks a new job with that key
UNIQUE_BLOCKS = {
    "active": frozenset({State.SCHEDULED, State.READY, State.RETRYING, State.RUNNING}),
    "queued": frozenset({State.SCHEDULED, State.READY, State.RETRYING}),
}
#: rounds of a unique key changing hands before an enqueue gives up
KEY_ROUNDS = 20
#: jobs of a bulk enqueue whose records are written in one update, while
#: the chunk's copies are sent
CHUNK = 1000
#: updates of a bulk enqueue's records on their way at once (the next
#: chunk's copies are made meanwhile)
RECORDS_ON_THE_WAY = 2
_AGAIN = "again"
#: a copy up to this many seconds before its record's time is taken (clocks differ)
EARLY = 0.05
#: seconds (on the state store's clock, from the copy's ``dw-t``) a new
#: job's copy read before its record waits for it in the worker; past that
#: it is dropped (its enqueue failed, or the record is gone).  Far above a
#: record write's time, far below anything a user waits for
RECORD_GRACE = 5.0
#: the version ``_parsed`` gives a foreign copy (no dw-id: ``foreign.py``)
FOREIGN = -1


# -- enqueue and publish ---------------------------------------------------------------


async def enqueue(
    b: KafkaEngine, msgs: list[Message], bodies: Mapping[str, bytes] | None = None
) -> list[str]:
    """Write the records of new jobs (a duplicate id or a held unique key
    answers the id already there) while their copies are sent; nothing of
    the batch stays if either cannot be written.  ``bodies``: the envelopes
    by id, where the caller encoded them already.

    A copy may reach a worker before its record: it waits there (``judge``,
    ``record_grace``).  A chunk whose record write ended later than half the
    grace has its copies sent again before the call returns (a worker may
    have dropped the first ones without their record; a copy twice runs
    once).  The copy of a duplicate id is sent too (the check is the
    record's write): it is judged by the record already there, as any copy
    of that job, so the job still runs once, with its first arguments."""
    n = b.names
    now = await b.now()
    began = time.monotonic()
    ids, fresh, taken_keys = await _fresh(b, msgs, now)
    if not fresh:
        return ids
    body = (bodies or {}).get
    sends: list[Sending] = []
    pending: deque[asyncio.Future[Chunk]] = deque()
    done: list[Chunk] = []
    try:
        unknown = {m.queue for m in fresh} - b.known_queues
        if unknown:  # the admin's list of queues
            await b.state.kv_set({n.queue + q: b"1" for q in unknown})
            b.known_queues |= unknown
        for i in range(0, len(fresh), CHUNK):
            part = fresh[i : i + CHUNK]
            # the copies' time (``dw-t``, what a worker measures the grace
            # from) is when they are sent, not when the call began
            at = time.monotonic()
            sent_at = now + (at - began)
            # each says what its record holds (``written``: ``belief.py``)
            out = [
                c for m in part for c in b.copy_of(m, 0, _due(b, m, now), sent_at, body(m.id), now)
            ]
            sends.append(await b.start_send(out))
            if len(fresh) <= CHUNK:  # one update: no task
                done.append(await _chunk(b, part, now, at))
                continue
            # the next chunk's copies are made while this one's records are
            # written (a few updates on their way at most)
            pending.append(asyncio.ensure_future(_chunk(b, part, now, at)))
            if len(pending) > RECORDS_ON_THE_WAY:
                done.append(await pending.popleft())
        while pending:
            done.append(await pending.popleft())
        for sending in sends:
            await sending.wait()
    except BaseException:
        # copies still on their way are not waited for: one written anyway
        # finds no record and is dropped after the grace; record writes
        # still on their way end first, and what they wrote is forgotten too
        for sending in sends:
            sending.abandon()
        done += [
            r
            for r in await asyncio.gather(*pending, return_exceptions=True)
            if isinstance(r, tuple)
        ]
        try:
            await b.state.kv_delete(
                [n.job + m.id for mine, _ in done for m in mine] + [n.key + k for k in taken_keys]
            )
        except Exception:  # the write's error is the one to report
            log.warning("kafka: could not forget the records of a failed enqueue", exc_info=True)
        raise
    late = [m for mine, slow in done if slow for m in mine]
    if late:  # a worker may have dropped their first copies: send them again
        again = await b.now()
        out = [c for m in late for c in b.copy_of(m, 0, _due(b, m, now), again, written=now)]
        await b.send(out)
    return ids


async def _fresh(
    b: KafkaEngine, msgs: list[Message], now: float
) -> tuple[list[str], list[Message], dict[str, str]]:
    """The id each message answers, the messages to write (not a repeated
    id, nor a unique key held by another job) and the unique keys they took."""
    ids: list[str] = []
    fresh: list[Message] = []
    taken_keys: dict[str, str] = {}
    seen: set[str] = set()
    for m in msgs:
        if m.id in seen:
            ids.append(m.id)
            continue
        if m.key is not None and m.kind == TASK:
            holder = taken_keys.get(m.key) or await _key_holder(b, m, now)
            if holder is not None:
                ids.append(holder)
                continue
            taken_keys[m.key] = m.id
        seen.add(m.id)
        fresh.append(m)
        ids.append(m.id)
    return ids, fresh, taken_keys


#: the records a chunk's update wrote, and whether it ended so late (half the
#: grace after its copies left) that a worker may have dropped them
Chunk = tuple[list[Message], bool]


async def _chunk(b: KafkaEngine, part: list[Message], now: float, sent: float) -> Chunk:
    """``_records`` of a chunk whose copies left at ``sent`` (monotonic)."""
    mine = await _records(b, part, now)
    return mine, time.monotonic() - sent > b.record_grace / 2


async def _records(b: KafkaEngine, msgs: list[Message], now: float) -> list[Message]:
    """Write the records of new jobs in one update; the jobs whose record
    was written (not those whose id was there already)."""
    n = b.names

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[Message]]:
        writes: dict[str, KvWrite] = {}
        new: list[Message] = []
        for m in msgs:
            if n.job + m.id in got:
                continue
            due = _due(b, m, now)
            state = State.SCHEDULED if due > now else State.READY
            writes[n.job + m.id] = Record(msg=m, state=state, run_at=due, updated_at=now).dump()
            new.append(m)
        return writes, new

    if len(msgs) == 1:  # the usual producer call: one add, no read
        m = msgs[0]
        writes, maybe = decide({})
        added = await b.state.kv_add(n.job + m.id, bytes(kv_write(writes[n.job + m.id])[0]))
        return maybe if added else []
    # a new job's id is almost never there: decide on "absent", which the
    # compare-and-set checks (a read, and a new decision, only if one was)
    keys = [n.job + m.id for m in msgs]
    return await b.state.kv_update_known(keys, decide, dict.fromkeys(keys))


def _due(b: KafkaEngine, m: Message, now: float) -> float:
    """When a new job is due on the state store's clock (its ``eta`` was
    set on this host's: ``clock.py``)."""
    return max(b.clock.to_server(m.eta), now) if m.eta is not None else now


async def _key_holder(b: KafkaEngine, m: Message, now: float) -> str | None:
    """The id of the job holding ``m.key`` (None: the key is now ``m``'s).
    A holder that is gone or done gives the key up in one update of the
    key's entry and its record, only if the entry still names it."""
    assert m.key is not None
    n = b.names
    kk = n.key + m.key
    blocks = UNIQUE_BLOCKS.get(m.headers.get("unique", ""), frozenset(State))
    for _ in range(KEY_ROUNDS):
        if await b.state.kv_add(kk, m.id.encode()):
            return None
        holder = (await b.state.kv_get([kk])).get(kk, b"").decode()
        rk = n.job + holder

        def decide(
            got: dict[str, bytes], holder: str = holder, rk: str = rk
        ) -> tuple[dict[str, KvWrite], str | None]:
            if got.get(kk, b"").decode() != holder:
                return {}, _AGAIN
            raw = got.get(rk) if holder else None
            if raw is not None and Record.load(raw).shown_state(now) in blocks:
                return {}, holder
            return {kk: m.id.encode()}, None

        taken = await b.state.kv_update([kk, rk] if holder else [kk], decide)
        if taken != _AGAIN:
            return taken
    raise BrokerError(f"kafka enqueue: the unique key {m.key!r} kept changing hands")


async def publish(b: KafkaEngine, events: list[Message]) -> int:
    """Keep each new event in its type's topic (the log the groups read) and
    write the record of each delivery to a bound group first; an event
    already published (its id marked) is skipped."""
    n = b.names
    now = await b.now()
    marks = {n.event + e.id: e for e in events}

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[Message]]:
        new = [e for k, e in marks.items() if k not in got]
        return {n.event + e.id: (b"1", b.event_retention) for e in new}, new

    new = await b.state.kv_update(list(marks), decide)
    if not new:
        return 0
    bound = await b.bindings()
    records: dict[str, bytes] = {}
    out = []
    count = 0
    for e in new:
        due = _due(b, e, now)
        state = State.SCHEDULED if due > now else State.READY
        for bd in bound:
            if bd.pattern != e.name:
                continue
            dm = delivery_of(e, bd, delivery_id(e.id, bd.queue))
            records[n.job + dm.id] = Record(msg=dm, state=state, run_at=due, updated_at=now).dump()
            count += 1
            if due > now:  # through a delay tier, to the group's own queue topic
                out += b.copy_of(dm, 0, due, now, written=now)
        topic = await b.event_topic(e.name)
        headers = [("dw-id", e.id.encode()), ("dw-at", f"{now:.6f}".encode())]
        if e.key is not None:
            headers.append(("dw-k", e.key.encode()))
        out.append((topic, (e.key or e.id).encode(), encode(e), headers))
    if records:
        await b.state.kv_set(records)
    await b.send(out)
    return count


# -- judging what a fetch read ---------------------------------------------------------


async def judge(
    b: KafkaEngine,
    copies: Sequence[Copy],
    group_queue: str | None,
    lease: float,
    worker: str,
    limit: int,
    queues: Mapping[str, str] | None = None,
    unrecorded: list[Copy] | None = None,
) -> tuple[list[tuple[Delivery, Copy]], list[Copy]]:
    """Lease up to ``limit`` jobs whose copies are current (see
    ``records.py``) and drop the stale copies.  ``group_queue``: the copies
    are events read by that group, where one key's deliveries run one at a
    time, in order (``capabilities.ordered_keys``): a copy whose key's
    earlier delivery is not settled waits.  Returns the deliveries (with
    the copy each was leased from) and the copies that wait (not judged:
    read again by the next fetch).  ``queues``: the queue of each topic read
    (a foreign record on one is buried there: ``foreign.py``).
    ``unrecorded``: filled with those of the waiting copies that wait for
    their record (a new job's copy read before it: ``enqueue``), which a
    fetch sets aside and judges again in a moment."""
    n = b.names
    now = await b.now()
    strangers: dict[str, tuple[Copy, str]] = {}
    qs = queues or {}
    wanted = _parsed(b, copies, group_queue, qs, strangers)
    if not wanted:
        return [], []
    # the pause of each copy's queue, read with the records: a queue paused
    # since the fetch looked leases nothing more (its copies wait)
    pause_of = {c: n.paused + q for c, *_ in wanted if (q := group_queue or qs.get(c.tp.topic))}
    keys = sorted(
        {n.job + cid for _, cid, _, _ in wanted}
        | {lk for *_, lk in wanted if lk}
        | set(pause_of.values())
    )
    early: list[Record] = []
    stored: list[dict[str, KvWrite]] = []
    awaited: list[Copy] = []
    grace_from = now - b.record_grace
    # first copies of jobs say what their records hold (``belief.py``): one
    # round trip when they are right, a read and a second try when not
    beliefs = believed(n, wanted, pause_of.values()) if group_queue is None else Beliefs()

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], tuple[list[Record], list[Copy]]]:
        writes: dict[str, KvWrite] = {}
        taken: list[Record] = []
        waiting: list[Copy] = []
        early.clear()
        awaited.clear()
        stored[:] = [writes]  # the last decision is the one stored
        done: set[str] = set()
        held: set[str] = set()  # keys whose earlier copy was taken or waits
        for c, cid, ver, lock in wanted:
            if (lock is not None and lock in held) or len(taken) >= limit or pause_of.get(c) in got:
                waiting.append(c)
                continue
            if cid in done:
                continue
            key = n.job + cid
            if ver == FOREIGN:  # buried the first time it is read (``foreign.py``)
                first = key not in got
                # read before (a record exists): it says what became of it
                verdict = TAKE if first else DROP
                rec: Record | None = foreign.buried_record(c, cid, strangers[cid][1], now)
            else:
                # a new job's copy may come before its record (``enqueue``)
                young = ver == 0 and group_queue is None and c.ready_at > grace_from
                parse = partial(beliefs.load, key)
                verdict, rec = _verdict(got.get(key), cid, ver, lock, got, young, parse)
            if verdict is not TAKE or rec is None:
                if lock is not None and verdict in (WAIT, DROP_AND_HOLD):
                    held.add(lock)
                if verdict in (WAIT, AWAIT):
                    (awaited if verdict is AWAIT else waiting).append(c)
                continue
            done.add(cid)
            if rec.run_at > now + EARLY:
                early.append(rec)  # ahead of its time: back to a delay tier
                continue
            if not T.take_lease(rec, now + lease, worker, now):
                continue  # not waiting: ``_verdict`` takes none such
            writes[key] = rec.dump()
            writes[n.lease + cid] = f"{rec.lease_until:.6f}".encode()
            if lock is not None:
                writes[lock] = (cid.encode(), b.event_retention)
                held.add(lock)
            taken.append(rec)
        return writes, (taken, waiting + awaited)

    taken, waiting = await beliefs.update(b.state, keys, decide)
    b.held.wrote(stored[-1], {n.job + r.msg.id: r for r in taken})  # decide ran at least once
    if unrecorded is not None:
        unrecorded += awaited
    # ahead of their time: back to a delay tier (nothing to send, mostly)
    await b.send([c for r in early for c in b.copy_of(r.msg, r.ver, r.run_at, now)])
    read_from = {cid: c for c, cid, _, _ in wanted}
    return [
        (
            Delivery(
                id=r.msg.id,
                message=r.msg if r.raw is None else None,
                token=r.token,
                lease_until=r.lease_until,
                queue=r.msg.queue,
                raw=r.raw,
                decode_error=None if r.raw is None else foreign.reason(r),
            ),
            read_from[r.msg.id],
        )
        for r in taken
    ], waiting


#: what ``_verdict`` says of a copy of ours
TAKE, WAIT, DROP, DROP_AND_HOLD = "take", "wait", "drop", "drop and hold"
#: and of a new job's copy read before its record
AWAIT = "wait for the record"


def _verdict(
    raw: bytes | None,
    cid: str,
    ver: int,
    lock: str | None,
    got: dict[str, bytes],
    young: bool = False,
    parse: Callable[[bytes], Record] = Record.load,
) -> tuple[str, Record | None]:
    """A copy of version ``ver`` against its record ``raw``: take it, wait
    (its key's earlier delivery is not settled: the key is held), wait for
    its record (none yet, and ``young``: a new job's copy within the grace,
    whose record may be on its way), drop it (stale, or no record), or drop
    it and hold its key (the delivery is still to run: retried or running,
    so the key's next waits)."""
    if raw is None:
        return (AWAIT if young else DROP), None
    rec = parse(raw)
    if lock is not None:
        holder = got.get(lock, SETTLED)
        if rec.state in WAITING and holder not in (SETTLED, cid.encode()):
            return WAIT, rec
    if rec.ver != ver or rec.state not in WAITING:
        if lock is not None and rec.state not in FINAL_STATES:
            return DROP_AND_HOLD, rec
        return DROP, rec
    return TAKE, rec


def _parsed(
    b: KafkaEngine,
    copies: Sequence[Copy],
    group_queue: str | None,
    queues: Mapping[str, str],
    strangers: dict[str, tuple[Copy, str]],
) -> list[tuple[Copy, str, int, str | None]]:
    """(copy, job id, version, key lock) of each copy; a foreign one
    (``foreign.py``) has the version ``FOREIGN`` and is put in ``strangers``
    (id -> copy, queue)."""
    out: list[tuple[Copy, str, int, str | None]] = []
    for c in copies:
        cid = c.header("dw-id")
        if cid is None:
            queue = group_queue or queues.get(c.tp.topic)
            if queue is None:  # not a topic of a queue read here: nothing to bury it in
                log.warning("kafka: skipped a record without a dw-id header at %s", origin(c))
                continue
            fid = foreign_id(c, queue)
            strangers[fid] = (c, queue)
            out.append((c, fid, FOREIGN, None))
            continue
        lock = None
        if group_queue is not None:
            cid, ver = delivery_id(cid, group_queue), 0
            key = c.header("dw-k")
            lock = None if key is None else b.names.keylock_of(group_queue, key)
        else:
            try:
                ver = int(c.header("dw-v") or 0)
            except ValueError:
                continue
        out.append((c, cid, ver, lock))
    return out


# -- outcomes ------------------------------------------------------------------------------

#: what an outcome does to a record (the transitions: ``brokers/transitions.py``):
#: how long to keep it (None: for good) and the copies to write after (a new
#: one, a dead letter); None when the delivery's lease is no longer held
Settled = tuple[float | None, bool, bool]
Change = Callable[[KafkaEngine, Record, Delivery, float], "Settled | None"]


def acked(b: KafkaEngine, rec: Record, d: Delivery, now: float) -> Settled | None:
    if not T.succeed(rec, d.token, now, d.result, compacts(d)):
        return None
    return T.kept_for(b.retention, d.result, d.result_ttl), False, False


def retried(b: KafkaEngine, rec: Record, d: Delivery, now: float) -> Settled | None:
    at = b.clock.to_server(d.retry_at)  # set on this host's clock
    return (None, True, False) if T.retry(rec, d.token, at, now, d.error) else None


def requeued(b: KafkaEngine, rec: Record, d: Delivery, now: float) -> Settled | None:
    at = b.clock.to_server(d.retry_at)  # set on this host's clock
    return (None, True, False) if T.requeue(rec, d.token, at, now) else None


def died(b: KafkaEngine, rec: Record, d: Delivery, now: float) -> Settled | None:
    return (None, False, True) if T.bury(rec, d.token, now, d.error) else None


async def settle(b: KafkaEngine, ds: Sequence[Delivery], change: Change) -> None:
    """Apply ``change`` to each record this worker still holds (a delivery
    whose lease was lost is ignored), then write the copies it calls for."""
    if not ds:
        return
    n = b.names
    now = await b.now()
    locks = [lk for d in ds if d.message is not None and (lk := lock_of(b, d.message))]
    keys = sorted({n.job + d.id for d in ds} | {n.lease + d.id for d in ds} | set(locks))
    held = b.held
    # an ack that keeps a compact record reads only the message's id, name,
    # queue and attempt (``T.succeed``): the record parsed at the lease
    # serves; any other change parses the record it writes back
    reuse = {d.id for d in ds if change is acked and compacts(d)}

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[tuple[Record, bool, bool]]]:
        writes: dict[str, KvWrite] = {}
        out: list[tuple[Record, bool, bool]] = []
        for d in ds:
            key = n.job + d.id
            raw = got.get(key)
            if raw is None:
                continue
            rec = held.record(key, raw) if d.id in reuse else Record.load(raw)
            settled = change(b, rec, d, now)
            if settled is None:  # its lease was lost: the fence
                continue
            ttl, again, dead = settled
            writes[n.job + d.id] = (rec.dump(), ttl)
            writes[n.lease + d.id] = (SETTLED, SETTLED_TTL)
            release(b, rec, got, writes)
            out.append((rec, again, dead))
        return writes, out

    known = held.known(keys)
    if known is None:
        changed = await b.state.kv_update(keys, decide)
    else:  # as this process wrote them: one round trip, unless they changed
        changed = await b.state.kv_update_known(keys, decide, known)
    held.forget(keys)
    out = []
    buried = []
    for rec, again, dead in changed:
        if again:
            out += b.copy_of(rec.msg, rec.ver, rec.run_at, now)
        if dead:
            buried += b.dead_copy(rec.msg, rec.raw)
    # a retry's copy is the job's next run: acknowledged before this returns.
    # A dead letter's copy is the DLQ topic's view of a record that already
    # says dead (with its errors; ``dlq ls`` and replay read the records):
    # the worker does not wait on it, as ``rescue`` does not
    await b.send(out)
    b.send_soon(buried)


async def extend(b: KafkaEngine, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
    if not ds:
        return []
    n = b.names
    now = await b.now()

    stored: list[dict[str, KvWrite]] = []

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[Delivery]]:
        writes: dict[str, KvWrite] = {}
        lost: list[Delivery] = []
        stored[:] = [writes]
        for d in ds:
            raw = got.get(n.job + d.id)
            rec = None if raw is None else Record.load(raw)
            if rec is None or not T.extend(rec, d.token, now + lease):
                lost.append(d)
                continue
            writes[n.job + d.id] = rec.dump()
            writes[n.lease + d.id] = f"{rec.lease_until:.6f}".encode()
        return writes, lost

    keys = [n.job + d.id for d in ds]
    known = b.held.known(keys)
    if known is None:
        lost = await b.state.kv_update(keys, decide)
    else:
        lost = await b.state.kv_update_known(keys, decide, known)
    b.held.wrote(stored[-1])
    b.held.forget([k for d in lost for k in (n.job + d.id, n.lease + d.id)])
    alive = {d.id for d in ds} - {d.id for d in lost}
    for d in ds:
        if d.id in alive:
            d.lease_until = now + lease
    return lost


async def rescue(b: KafkaEngine) -> Rescued:
    """Jobs whose lease ran out (their worker died or hung) get a new copy,
    or go to the dead-letter topic on their last attempt."""
    n = b.names
    now = await b.now()
    expired: list[str] = []
    for k, v in (await b.state.kv_scan(n.lease)).items():
        if v == SETTLED:
            continue
        try:
            until = float(v)
        except ValueError:
            until = 0.0
        if until <= now:
            expired.append(k[len(n.lease) :])
    if not expired:
        return Rescued(0)
    keys = [n.job + i for i in expired] + [n.lease + i for i in expired]

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[tuple[Record, bool]]]:
        writes: dict[str, KvWrite] = {}
        out: list[tuple[Record, bool]] = []
        for i in expired:
            writes[n.lease + i] = (SETTLED, SETTLED_TTL)
            raw = got.get(n.job + i)
            if raw is None:
                continue
            rec = Record.load(raw)
            state = T.rescue(rec, now)
            if state is None:
                if rec.state is State.RUNNING:  # extended since the scan
                    writes[n.lease + i] = f"{rec.lease_until:.6f}".encode()
                continue
            if state is State.DEAD:
                release(b, rec, got, writes)
            out.append((rec, state is State.DEAD))
            writes[n.job + i] = rec.dump()
        return writes, out

    changed = await b.state.kv_update(keys, decide)
    out = []
    buried = []
    dead = []
    for rec, is_dead in changed:
        if is_dead:
            buried += b.dead_copy(rec.msg, rec.raw)
            err = rec.msg.errors[-1]
            msg = None if rec.raw is not None else rec.msg  # a foreign record: no envelope
            dead.append(DeadLetter(rec.msg.id, rec.msg.queue, rec.msg.name, err, msg))
        else:
            out += b.copy_of(rec.msg, rec.ver, now, now)
    await b.send(out)
    # the dead letters are stored (their records): reported now, while their
    # copies for people reading the DLQ topic are on their way
    b.send_soon(buried)
    return Rescued(len(changed), dead)


async def reconcile(b: KafkaEngine) -> int:
    """Write a new copy of each job due for ``stranded`` seconds and not
    taken: its copy was lost (a producer that died between the record and
    the copy, a cluster that lost acknowledged records: tansu keeps nothing
    over a restart).  One process of the app at a time (a lock), each at
    most every ``stranded / 2`` seconds (at most once a minute): it reads
    every record.  A copy still on its way is made stale by the new one and
    dropped when read."""
    now_m = time.monotonic()
    if now_m < b.reconcile_at:
        return 0
    b.reconcile_at = now_m + min(60.0, b.stranded / 2)
    n = b.names
    token = await b.state.acquire(n.reconciler, b.instance, 60.0)
    if token is None:
        return 0
    try:
        now = await b.now()
        old = now - b.stranded
        ids = [
            k[len(n.job) :]
            for k, raw in (await b.state.kv_scan(n.job)).items()
            if (at := Record.waiting_since(raw)) is not None and at < old
        ]

        def change(rec: Record, now: float) -> tuple[float | None, bool] | None:
            if rec.run_at >= old or not T.reschedule(rec, now, now):
                return None  # changed since the scan: its copy is new
            return None, True

        moved = await change_waiting(b, ids, change)
        return len(moved)
    finally:
        await b.state.release(n.reconciler, b.instance, token)


# -- admin changes -------------------------------------------------------------------------


async def change_waiting(
    b: KafkaEngine,
    ids: Sequence[str],
    change: Callable[[Record, float], tuple[float | None, bool] | None],
) -> list[str]:
    """Apply ``change`` (a transition: None where it refuses) to the records
    of ``ids``: how long to keep each (None: for good), and whether to write
    a new copy."""
    if not ids:
        return []
    n = b.names
    now = await b.now()

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[tuple[Record, bool]]]:
        writes: dict[str, KvWrite] = {}
        out: list[tuple[Record, bool]] = []
        for i in ids:
            raw = got.get(n.job + i)
            if raw is None:
                continue
            rec = Record.load(raw)
            changed = change(rec, now)
            if changed is None:
                continue
            ttl, again = changed
            writes[n.job + i] = (rec.dump(), ttl)
            release(b, rec, got, writes)
            out.append((rec, again))
        return writes, out

    unique = list(dict.fromkeys(ids))
    keys = [n.job + i for i in unique] + await locks_of(b, unique)
    changed = await b.state.kv_update(keys, decide)
    await b.send(
        [c for rec, again in changed if again for c in b.copy_of(rec.msg, rec.ver, rec.run_at, now)]
    )
    return [rec.msg.id for rec, _ in changed]


async def cancel(b: KafkaEngine, ids: Sequence[str]) -> list[str]:
    def change(rec: Record, now: float) -> tuple[float | None, bool] | None:
        return (b.retention, False) if T.cancel(rec, now) else None

    return await change_waiting(b, ids, change)


async def reschedule(b: KafkaEngine, ids: Sequence[str], at: float) -> list[str]:
    at = b.clock.to_server(at)

    def change(rec: Record, now: float) -> tuple[float | None, bool] | None:
        return (None, True) if T.reschedule(rec, at, now) else None

    return await change_waiting(b, ids, change)


# -- ordered keys ----------------------------------------------------------------------------


def lock_of(b: KafkaEngine, msg: Message) -> str | None:
    """The key lock of an event delivery with a key (None for anything else)."""
    if msg.key is None or not msg.queue.startswith(GROUP_PREFIX):
        return None
    return b.names.keylock_of(msg.queue, msg.key)


def release(b: KafkaEngine, rec: Record, got: dict[str, bytes], writes: dict[str, KvWrite]) -> None:
    """Free the key of a delivery that reached a final state, if it holds it
    (read in ``got``: the caller's update read the lock)."""
    lock = lock_of(b, rec.msg)
    if lock is not None and rec.state in FINAL_STATES and got.get(lock) == rec.msg.id.encode():
        writes[lock] = (SETTLED, SETTLED_TTL)


async def locks_of(b: KafkaEngine, ids: Sequence[str]) -> list[str]:
    """The key locks the records of ``ids`` may hold (read first, so that an
    update that may settle them reads their locks too)."""
    got = await b.state.kv_get([b.names.job + i for i in ids])
    out = []
    for raw in got.values():
        lock = lock_of(b, Record.load(raw).msg)
        if lock is not None:
            out.append(lock)
    return out
