"""The job's state record, the pointer headers and the delivery token.

A job is a *pointer* message in the work stream (its envelope, on the subject
of its queue and priority) plus, once anything happened to it, a *state
record* in the jobs stream (``dw.NS.j.s.ID``): the envelope with its current
attempt and errors, the state, and the lease while it runs.  The record is
the truth; pointers only bring jobs to workers.  Every change of a record is
a compare-and-set on its subject's last sequence, so two processes can never
both move a job: a claim, a settle, a heartbeat, a rescue, a cancel each win
or see that someone else did.

A pointer carries a generation (``Dw-G``): a pointer whose generation is not
the record's is stale (the job was retried, rescheduled, replayed, rescued
since) and is dropped when it is delivered.  Generation ``0`` is the
enqueue's pointer of a job that has no record yet: its claim creates the
record (``expect=0``) in one round trip.

A message on a work subject that is not an envelope (put there by something
else than dumbwaiter) becomes a job like any other, so it can be listed,
counted, dead-lettered, replayed and purged: its record carries a stand-in
envelope (task ``?``) and the body itself (``raw``, base64: it may be any
bytes), and every pointer published for it again carries that body, marked
``Dw-Raw``, so a worker gets it as the undecodable message it is.

A succeeded task without ``keep_result`` leaves a *compact* record
(``brokers/finished.py``, ``compact_record``): its envelope cut to id, task,
queue and attempt, the worker's timing cut to when it started, and only the
fields a settle's retry, a holder's rescue and a pointer's claim read of a
succeeded record (generation, claim, settling holder).  A record written
whole loads as it always did.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message, from_dict
from ...state import State
from ..finished import compact_message, started_only
from ..types import DeadLetter, JobInfo

#: record field names (short: a record is written at every transition)
ST, ENV, GEN, RUN_AT, UPDATED, WORKER, LEASE, CLAIM, ACK, HOLDER, BY, REPLAYS, RESULT = (
    "st", "m", "g", "ra", "u", "w", "lu", "c", "ack", "h", "by", "rp", "res",
)  # fmt: skip
#: the holder list that counts a settle (the settling connection's): see rescue
SETTLED_BY = "sh"
#: an undecodable message's body (base64), kept with its stand-in envelope
RAW = "raw"
#: a compact record's mark, and the time its job started (the worker's
#: timing rebuilt from it and ``u``, as Redis does)
COMPACT, STARTED = "cr", "rs"

RUNNING = State.RUNNING.value
WAITING = frozenset({State.READY.value, State.SCHEDULED.value, State.RETRYING.value})
FINAL = frozenset({State.SUCCEEDED.value, State.DEAD.value, State.CANCELLED.value})
#: a purged job's record: gone for ``get``, and its pointers are dropped
PURGED = "purged"


def new_gen() -> str:
    """A fresh generation: random, so two writers never pick the same one."""
    return secrets.token_hex(6)


@dataclass(slots=True)
class Token:
    """What a delivery holds: the claim's sequence (stable while it holds the
    job), the record's latest sequence (the next compare-and-set), the
    JetStream ack subject of the pointer it came with, and record fields a
    settle rewrites."""

    claim: int
    seq: int
    reply: bytes
    gen: str
    replays: int
    run_at: float
    holder: str
    worker: str
    #: an undecodable message's kept body (the record's ``raw``) and its
    #: stand-in envelope with the errors so far: every rewrite keeps them
    raw: str | None = None
    env: dict[str, Any] | None = None
    #: this delivery's entry in its process' holder list (``Holder.owned``);
    #: None takes whatever entry the job has
    entry: list[Any] | None = None


def claim_of(rec: dict[str, Any], seq: int) -> int:
    """The claim a running record belongs to: its ``c`` field, or its own
    sequence when it is the claim's write itself (``c`` is 0 there)."""
    return int(rec.get(CLAIM) or seq)


def dumps(rec: dict[str, Any]) -> bytes:
    return orjson.dumps(rec)


def loads(data: bytes) -> dict[str, Any]:
    d = orjson.loads(data)
    if not isinstance(d, dict):
        raise MessageDecodeError("NATS job record is not a JSON object")
    return d


def raw_env(jid: str, queue: str, attempt: int = 0) -> dict[str, Any]:
    """The stand-in envelope of a message that is not one: the SQL and Redis
    engines show such a job the same way (task ``?``, its queue)."""
    return {"id": jid, "kind": "task", "name": "?", "queue": queue, "attempt": attempt}


def raw_field(body: bytes) -> str:
    return base64.b64encode(body).decode()


def raw_of(rec: dict[str, Any]) -> bytes | None:
    """The kept body of an undecodable message's record (None for a job)."""
    kept = rec.get(RAW)
    if not isinstance(kept, str):
        return None
    try:
        return base64.b64decode(kept, validate=True)
    except (binascii.Error, ValueError):
        return kept.encode()


def compact_record(
    env: dict[str, Any], gen: str, now: float, by: int, replays: int, result: bytes | None
) -> dict[str, Any]:
    """The compact record of a succeeded task (the module doc); the settle
    adds the holder that counts it (``SETTLED_BY``)."""
    rec: dict[str, Any] = {
        ST: State.SUCCEEDED.value,
        COMPACT: 1,
        ENV: {k: env[k] for k in ("id", "name", "queue", "attempt") if k in env},
        GEN: gen,
        UPDATED: now,
        BY: by,
    }
    if replays:
        rec[REPLAYS] = replays
    started = started_only(result)
    if started is not None:
        rec[STARTED] = started
    elif result is not None:
        rec[RESULT] = result.decode()
    return rec


def _compact_info(rec: dict[str, Any]) -> JobInfo:
    env = rec.get(ENV) or {}
    updated = rec.get(UPDATED)
    started = rec.get(STARTED)
    if started is not None:
        result: bytes | None = orjson.dumps({"started": started, "finished": updated})
    else:
        result = rec[RESULT].encode() if rec.get(RESULT) is not None else None
    return JobInfo(
        message=compact_message(
            str(env.get("id", "?")),
            str(env.get("name", "?")),
            str(env.get("queue", "?")),
            int(env.get("attempt") or 1),
        ),
        state=State.SUCCEEDED,
        updated_at=updated,
        result=result,
        replays=int(rec.get(REPLAYS, 0)),
        compact=True,
    )


def info_of(rec: dict[str, Any], now: float) -> JobInfo | None:
    """The admin view of a state record (None for a purged job)."""
    st = rec.get(ST)
    if st == PURGED or st is None:
        return None
    if rec.get(COMPACT) and st == State.SUCCEEDED.value:
        return _compact_info(rec)
    msg = message_of(rec)
    state = State(st)
    return JobInfo(
        message=msg,
        state=state,
        run_at=rec.get(RUN_AT),
        updated_at=rec.get(UPDATED),
        worker=rec.get(WORKER),
        lease_until=rec.get(LEASE) if st == RUNNING else None,
        result=rec[RESULT].encode() if rec.get(RESULT) is not None else None,
        replays=int(rec.get(REPLAYS, 0)),
        raw=raw_of(rec),
    )


def message_of(rec: dict[str, Any]) -> Message:
    env = rec.get(ENV)
    if isinstance(env, dict):
        try:
            return from_dict(env)
        except MessageDecodeError:
            pass
    return Message(id=str(rec.get("id", "?")), kind="task", name="?", queue=str(rec.get("q", "?")))


def waiting_state(attempt: int, run_at: float, now: float) -> str:
    """The state of a job waiting to run: scheduled, retrying (failed
    before) or ready."""
    if run_at > now:
        return State.RETRYING.value if attempt > 0 else State.SCHEDULED.value
    return State.READY.value


def fresh_info(env: dict[str, Any], run_at: float, enqueued: float, now: float) -> JobInfo:
    """The admin view of a job that has no state record yet (just enqueued)."""
    msg = from_dict(env)
    state = State.SCHEDULED if run_at > now else State.READY
    return JobInfo(message=msg, state=state, run_at=run_at, updated_at=enqueued)


def dead_letter(env: dict[str, Any]) -> DeadLetter:
    """The report of a job buried for a lost lease: its envelope (a state
    record's) carries the ``LeaseExpired`` error just appended, and goes with
    the report whole (on_dead hooks log its arguments)."""
    errors = env.get("errors") or [{}]
    try:
        msg: Message | None = from_dict(env)
    except MessageDecodeError:
        msg = None
    return DeadLetter(
        str(env.get("id", "")),
        str(env.get("queue", "") or "?"),
        str(env.get("name", "") or "?"),
        ErrorRecord.from_dict(errors[-1]),
        msg,
    )
