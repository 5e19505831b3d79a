"""What the NATS engine reads off a pointer and a record, shared by its
parts: a delivered pointer decoded (``Ptr``), the envelope a settle writes,
the lease-lost error, a fresh job's view from its index entry, kv expiry,
lock tokens, probe answers and event delivery ids.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import (
    LeaseExpired,
    MessageDecodeError,
)
from ...message import ErrorRecord, from_dict
from ..types import Delivery, JobInfo
from . import records as R
from .names import Subjects, digest, untok
from .protocol import (
    Reply,
    header,
)
from .puller import Pulled
from .store import Stored, ack_meta

UNIQUE_BLOCKS: dict[str, frozenset[str] | None] = {
    "active": frozenset({"scheduled", "ready", "retrying", "running"}),
    "queued": frozenset({"scheduled", "ready", "retrying"}),
}


class Ptr:
    """A delivered pointer, decoded."""

    __slots__ = ("data", "env", "error", "gen", "id", "queue", "replays", "reply", "seq")

    def __init__(self, it: Pulled, queue: str, names: Subjects) -> None:
        self.reply = it.reply
        self.data = it.data
        self.queue = queue
        self.error: str | None = None
        self.env: dict[str, Any] | None
        try:
            env = orjson.loads(it.data)
            if not isinstance(env, dict):
                raise MessageDecodeError("message body is not a JSON object")
            self.env = env
        except (orjson.JSONDecodeError, MessageDecodeError) as exc:
            self.env, self.error = None, _not_an_envelope(it.data, exc)
        jid = header(it.hdr, b"Dw-Id")
        if jid:
            self.id = jid.decode()
        elif self.env is not None and isinstance(self.env.get("id"), str):
            self.id = self.env["id"]
        else:
            self.id = f"nats-{ack_meta(it.reply).stream_seq}"
        self.gen = (header(it.hdr, b"Dw-G") or b"0").decode()
        #: the record's sequence when this pointer was published (0: none yet)
        self.seq = int(header(it.hdr, b"Dw-S") or 0)
        self.replays = int(header(it.hdr, b"Dw-Rp") or 0)
        if self.env is not None and header(it.hdr, b"Dw-Raw") is not None:
            # an undecodable message's body again (replayed, given back): JSON
            # that is not an envelope, or the kept head of a longer body
            try:
                from_dict(self.env)
                why = "the kept head of a longer body that is not a valid envelope"
            except MessageDecodeError as exc:
                why = str(exc)
            self.undecodable(why)

    def undecodable(self, why: str) -> None:
        """Take this pointer as the undecodable message it is (the claim keeps
        its body in the job's record)."""
        self.env, self.error = None, why

    @classmethod
    def of(cls, it: Pulled, names: Subjects) -> Ptr:
        parts = it.subject.split(b".")
        return cls(it, untok(parts[-2]) if len(parts) >= 2 else "?", names)


def _not_an_envelope(data: bytes, exc: Exception) -> str:
    """Why a pointer's body is not an envelope, in words that name the problem
    (orjson calls bytes that are not UTF-8 "surrogates not allowed")."""
    try:
        data.decode()
    except UnicodeDecodeError as bad:
        return (
            f"message body is not valid UTF-8 (byte 0x{data[bad.start]:02x} at offset "
            f"{bad.start}), so it is not a JSON envelope"
        )
    return f"message body is not a valid envelope: {exc}"


def env_of(d: Delivery) -> dict[str, Any]:
    """The envelope a delivery's record is rewritten with: an undecodable
    message's is the stand-in its record had (with the errors so far)."""
    if d.message is not None:
        return d.message.to_dict()
    tok = d.token
    if isinstance(tok, R.Token) and tok.env is not None:
        env = dict(tok.env)
        env["errors"] = list(env.get("errors") or [])
        return env
    return R.raw_env(d.id, d.queue, 1)


def queue_of(d: Delivery) -> str:
    return d.message.queue if d.message is not None else "?"


def lease_error(rec: dict[str, Any], now: float) -> dict[str, Any]:
    worker = str(rec.get(R.WORKER) or "")
    attempt = int((rec.get(R.ENV) or {}).get("attempt", 0))
    return ErrorRecord(
        time=now,
        type=f"dumbwaiter.errors.{LeaseExpired.__name__}",
        message=f"lease expired: worker {worker or '?'} stopped heartbeating "
        f"during attempt {attempt}",
        worker=worker,
        attempt=attempt,
    ).to_dict()


def _next_pointer(n: Subjects, seq: int) -> bytes:
    """A direct get's body: the first pointer at or after ``seq``."""
    return b'{"seq":%d,"next_by_subj":"%s>"}' % (seq, n.w)


def _duplicate_of(r: Reply) -> int:
    """The sequence a probe's ``Nats-Msg-Id`` is a duplicate of (0: none)."""
    if b'"duplicate"' not in r.data:
        return 0
    d = orjson.loads(r.data)
    return int(d["seq"]) if d.get("duplicate") else 0


def fresh_of(e: Stored, now: float) -> JobInfo:
    """A fresh job's admin view from its index entry or its pointer (whose
    server time is the enqueue's)."""
    env = orjson.loads(e.data)
    u = float(e.get(b"Dw-U") or 0) or e.time or now
    ra = float(e.get(b"Dw-Ra") or 0) or u  # 0: ready at once (when enqueued)
    return R.fresh_info(env, ra, u, now)


def fresh_record(e: Stored | None, now: float) -> dict[str, Any]:
    """A fresh job's index entry as a state record (its first transition)."""
    assert e is not None
    env = orjson.loads(e.data)
    u = float(e.get(b"Dw-U") or 0) or e.time or now
    ra = float(e.get(b"Dw-Ra") or 0) or u
    return {
        R.ST: R.waiting_state(0, ra, now),
        R.ENV: env,
        R.GEN: "0",
        R.RUN_AT: ra,
        R.UPDATED: u,
        R.REPLAYS: 0,
    }


def live(cur: Stored | None, now: float) -> bytes | None:
    if cur is None:
        return None
    exp = cur.get(b"Dw-Exp")
    if exp is not None and float(exp) <= now:
        return None
    return cur.data


def lock_token(held: dict[str, Any], cur: Stored) -> int:
    return int(held.get("t") or cur.seq)


def delivery_id(event_id: str, queue: str) -> str:
    """The id of an event's delivery to one group: derived from both, so a
    second publish of the event makes the same ids (and stores nothing), and
    time-ordered like the event's own UUIDv7."""
    h = digest(event_id + "\x00" + queue) + digest(queue + "\x00" + event_id)
    ts = event_id.replace("-", "")[:12]
    if len(ts) != 12 or any(c not in "0123456789abcdef" for c in ts):
        ts = h[20:32]
    variant = "%x" % (0x8 | (int(h[3], 16) & 0x3))
    v = ts + "7" + h[0:3] + variant + h[4:19]
    return f"{v[:8]}-{v[8:12]}-{v[12:16]}-{v[16:20]}-{v[20:]}"
