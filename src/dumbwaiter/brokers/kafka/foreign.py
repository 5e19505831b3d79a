"""Records on a queue topic that dumbwaiter did not write (no ``dw-id``
header): a foreign producer's, a script's, a tool's.

Every other broker dead-letters a body that is not a job with its reason,
and keeps the body so that the user sees what was on the queue.  A Kafka
copy of ours is only a pointer to its record in the state store (which a
foreign producer never wrote), so a foreign record is given a record of its
own the first time a worker reads it: a stub naming its queue and where it
was read, the record's bytes as its raw body, leased to that worker like
any job.  The worker dead-letters it with the reason (the same words every
broker gives an undecodable body), and from then on it is a dead letter
like any other: ``dlq ls``, ``stats``, ``dlq show`` (with the raw bytes),
``dlq replay`` (it dies again, for the same reason) and ``dlq purge``.

Its id is derived from where it was read (topic, partition, offset, and
the record's time, which tells apart the offsets a server that lost its
log hands out again), so a record read twice (a worker killed before its
offset was committed, a rebalance) is recognised and not buried twice.
"""

from __future__ import annotations

from ...errors import MessageDecodeError
from ...message import TASK, Message, decode
from ...state import State
from .records import Record, delivery_id
from .transport import Copy

#: the stub's header naming where the record was read
ORIGIN = "kafka-record"


def foreign_id(c: Copy, queue: str) -> str:
    """The id of the record of a foreign copy read by ``queue``'s readers:
    the same each time it is read, time-ordered by the record's time."""
    ms = f"{max(0, round(c.timestamp * 1000)):012x}"[-12:]
    return delivery_id(ms, f"{queue}\x1f{c.tp.topic}\x1f{c.tp.partition}\x1f{c.offset}")


def origin(c: Copy) -> str:
    return f"{c.tp.topic}[{c.tp.partition}] offset {c.offset}"


def buried_record(c: Copy, id_: str, queue: str, now: float) -> Record:
    """The stub record a foreign copy gets when it is first read (then
    leased: ``transitions.take_lease``), its bytes kept as the raw body."""
    stub = Message(
        id=id_,
        kind=TASK,
        name="?",
        queue=queue,
        created_at=c.timestamp or now,
        headers={ORIGIN: origin(c)},
    )
    return Record(msg=stub, state=State.READY, run_at=now, updated_at=now, raw=c.value)


def reason(rec: Record) -> str:
    """Why a foreign record is not a job (the worker puts the words every
    broker uses for a body that is not UTF-8 first: ``undecodable``)."""
    where = rec.msg.headers.get(ORIGIN, "a Kafka record")
    try:
        decode(rec.raw or b"")
    except MessageDecodeError as exc:
        return f"{exc} ({where}, written without dumbwaiter's dw-id header)"
    return f"{where} has no dw-id header: an envelope written by another producer, not a job"
