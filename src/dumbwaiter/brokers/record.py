"""The job record an engine keeps in its state store when its transport
holds messages but no searchable index (RabbitMQ's ledger, Kafka's records).

Neither a queue nor a log can say where job ``X`` is, list dead jobs by
error type, or tell a stale copy from the current one.  So every job has a
record in the state store (any dumbwaiter broker, through its key-value
seam): the envelope, its state, a version that grows with each copy of it
sent to the transport, and the fencing token of its current lease.  A copy
whose version is not its record's is stale and dropped.  One record format
for both engines, and one set of state changes (``transitions.py``).

A succeeded task without ``keep_result`` keeps a *compact* record
(``finished.py``): ``{"c":1,...}``, its id, task, queue, attempt, state,
version, token, finish time, result (the worker's timing) and replays, no
envelope.  A record written whole (``"m"``) loads as it always did.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from ..message import Message, from_dict
from ..state import State
from .finished import compact_message, started_only
from .types import JobInfo

_WAITING = frozenset({State.READY.value, State.SCHEDULED.value})


@dataclass(slots=True)
class Record:
    msg: Message
    state: State
    ver: int = 0
    token: int = 0
    run_at: float = 0.0
    updated_at: float = 0.0
    worker: str | None = None
    lease_until: float = 0.0
    result: bytes | None = None
    replays: int = 0
    #: the token of the enqueue that wrote this record, which its first copy
    #: carries in ``dw-e``: a copy of another enqueue of the same id (one that
    #: lost the record's ``kv_add``) carries another token and is dropped;
    #: None in a record a version before the tokens wrote or rewrote (its
    #: copies are then judged by their version alone)
    enq: str | None = None
    #: the body of a message that is not an envelope (``msg`` is then a stub
    #: naming its id, queue and the decode error): kept, as the SQL brokers
    #: keep theirs, so that ``get`` shows what was on the queue, and put
    #: back on the queue as it came by a replay
    raw: bytes | None = None
    #: a compact record (``finished.py``): ``msg`` names the job's id, task,
    #: queue and attempt only, and ``dump`` writes no envelope, run time,
    #: worker or enqueue token (nothing reads them once it succeeded)
    compact: bool = False

    def copy(self) -> Record:
        """A copy to change, its message shared (copy that too before
        changing it).  Field by field: ``dataclasses.replace`` introspects
        the class on every call, and an ack makes one per job."""
        return Record(
            self.msg,
            self.state,
            self.ver,
            self.token,
            self.run_at,
            self.updated_at,
            self.worker,
            self.lease_until,
            self.result,
            self.replays,
            self.enq,
            self.raw,
            self.compact,
        )

    def dump(self) -> bytes:
        if self.compact:
            return self._dump_compact()
        d: dict[str, Any] = {
            "m": self.msg.to_dict(),
            "s": self.state.value,
            "v": self.ver,
            "t": self.token,
            "r": self.run_at,
            "u": self.updated_at,
            "w": self.worker,
            "l": self.lease_until,
            "p": self.replays,
        }
        if self.result is not None:
            d["x"] = self.result.decode()
        if self.enq is not None:
            d["e"] = self.enq
        if self.raw is not None:
            d["b"] = base64.b64encode(self.raw).decode()  # any bytes, not only UTF-8
        return orjson.dumps(d)

    def _dump_compact(self) -> bytes:
        """The compact record: what ``get``, the listing and the ledger's
        stamp (version, token, state) read, in the fewest bytes."""
        m = self.msg
        d: dict[str, Any] = {
            "c": 1,
            "i": m.id,
            "n": m.name,
            "q": m.queue,
            "a": m.attempt,
            "s": self.state.value,
            "v": self.ver,
            "t": self.token,
            "u": self.updated_at,
        }
        started = started_only(self.result)
        if started is not None:
            d["g"] = started  # the result rebuilt from it and ``u`` (as Redis does)
        elif self.result is not None:
            d["x"] = self.result.decode()
        if self.replays:
            d["p"] = self.replays
        return orjson.dumps(d)

    @classmethod
    def load(cls, raw: bytes, copy: Message | None = None, ver: int = -1) -> Record:
        """Parse a record.  ``copy`` is the message of a copy of version
        ``ver``: a waiting job's record holds the very envelope its current
        copy carries, so the fetch path takes that one and skips a parse."""
        d = orjson.loads(raw)
        if "c" in d:
            return cls._load_compact(d)
        x = d.get("x")
        b = d.get("b")
        same = copy is not None and d["v"] == ver and d["s"] in _WAITING
        return cls(
            msg=copy if same and copy is not None else from_dict(d["m"]),
            state=State(d["s"]),
            ver=int(d["v"]),
            token=int(d["t"]),
            run_at=float(d["r"]),
            updated_at=float(d["u"]),
            worker=d.get("w"),
            lease_until=float(d.get("l") or 0.0),
            result=None if x is None else x.encode(),
            replays=int(d.get("p") or 0),
            enq=d.get("e"),
            raw=None if b is None else base64.b64decode(b),
        )

    @staticmethod
    def waiting_since(raw: bytes) -> float | None:
        """The run time of a waiting (ready or scheduled) record, else None:
        read without building its envelope, for scans of every record."""
        d = orjson.loads(raw)
        if "c" in d or d["s"] not in _WAITING:
            return None
        return float(d["r"])

    @classmethod
    def _load_compact(cls, d: dict[str, Any]) -> Record:
        x, g = d.get("x"), d.get("g")
        if g is not None:
            x = orjson.dumps({"started": g, "finished": d["u"]}).decode()
        return cls(
            msg=compact_message(d["i"], d["n"], d["q"], int(d.get("a") or 1)),
            state=State(d["s"]),
            ver=int(d["v"]),
            token=int(d["t"]),
            updated_at=float(d["u"]),
            result=None if x is None else x.encode(),
            replays=int(d.get("p") or 0),
            compact=True,
        )

    def shown_state(self, now: float) -> State:
        """The state as the seam reports it: a scheduled job that failed
        before is ``retrying``; one whose time has come is ``ready``."""
        if self.state is State.SCHEDULED:
            if self.run_at <= now:
                return State.READY
            if self.msg.attempt > 0:
                return State.RETRYING
        return self.state

    def info(self, now: float) -> JobInfo:
        if self.compact:  # no run time, worker or lease was kept
            return JobInfo(
                message=self.msg,
                state=self.state,
                updated_at=self.updated_at,
                result=self.result,
                replays=self.replays,
                compact=True,
            )
        return JobInfo(
            message=self.msg,
            state=self.shown_state(now),
            run_at=self.run_at,
            updated_at=self.updated_at,
            worker=self.worker,
            lease_until=self.lease_until if self.state is State.RUNNING else None,
            result=self.result,
            replays=self.replays,
            raw=self.raw,
        )


def count_states(
    records: Iterable[Record], now: float, counts: dict[str, dict[str, float]]
) -> None:
    """Add ``stats``' counts of ``records`` to ``counts`` (queue -> state ->
    jobs, and ``lag``: the longest a ready job has waited), as
    ``base.stats_rows`` reads them."""
    for rec in records:
        c = counts.setdefault(rec.msg.queue, {})
        state = rec.shown_state(now)
        c[state.value] = c.get(state.value, 0) + 1
        if state is State.READY:
            c["lag"] = max(c.get("lag", 0.0), now - rec.run_at)


def delivery_id(event_id: str, queue: str) -> str:
    """The id of an event's delivery to one group: derived, so every process
    that sees or reads the event names it alike, and time-ordered
    like the event's own UUIDv7 (its first 48 bits are the event's)."""
    h = hashlib.blake2b(f"{event_id}\x1f{queue}".encode(), digest_size=10).hexdigest()
    ms = event_id.replace("-", "")[:12]
    variant = "89ab"[int(h[3], 16) & 3]
    raw = f"{ms}7{h[:3]}{variant}{h[4:19]}"
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:32]}"


def new_record(raw: bytes, state: State, run_at: float, now: float, enq: str) -> bytes:
    """``Record(msg, state, run_at=run_at, updated_at=now, enq=enq).dump()``
    of a new job whose envelope ``encode_checked`` made ``raw``: those bytes
    are the record's ``"m"`` as they are, not ``msg`` encoded a second time
    (a producer's hot path; ``dump`` above is the format, kept in step by
    tests/unit/test_rabbitmq_producer.py)."""
    rest = orjson.dumps(
        {
            "s": state.value,
            "v": 0,
            "t": 0,
            "r": run_at,
            "u": now,
            "w": None,
            "l": 0.0,
            "p": 0,
            "e": enq,
        }
    )
    return b'{"m":' + raw + b"," + rest[1:]
