"""The message envelope every job and event travels in, and its JSON codec.

The envelope is DESIGN §2: ``id`` (UUIDv7), ``kind``, ``name``, ``queue``,
``args``/``kwargs`` (tasks) or ``payload`` (events), ``headers``, ``attempt``,
``max_attempts``, ``created_at``, ``eta``, ``priority``, ``key`` and
``errors``.  Times are Unix epoch seconds (floats) so every engine can compare
them without parsing.

Only JSON travels: ``check_json`` walks a value before it is encoded and names
the first part JSON cannot carry (a ``datetime``, a ``set``, a NaN, a
non-string key...), because silently turning a ``datetime`` into a string or a
NaN into ``null`` would hand the task something else than the caller passed.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import MessageDecodeError, PayloadTooLarge, SerializationError

TASK = "task"
EVENT = "event"
KINDS = (TASK, EVENT)

#: the queue of a subscriber group's event deliveries is GROUP_PREFIX + group
GROUP_PREFIX = "group:"

#: default maximum size of one encoded message (1 MiB)
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


# -- ids -------------------------------------------------------------------

_uuid_lock = threading.Lock()
_last_ms = 0
_seq = 0
_VARIANT = 0b10 << 62  # RFC 9562 variant bits of rand_b
_RAND_B = (1 << 62) - 1  # its 62 random bits
_getrandbits = random.getrandbits
_time_ns = time.time_ns


#: (millisecond, the id's text up to its counter) of the last millisecond
#: ``uuid7`` formatted: one tuple, swapped whole, so a thread never pairs one
#: millisecond with another's text
_prefix: tuple[int, str] = (-1, "")


def _ms_prefix(ms: int) -> str:
    h = f"{ms:012x}"
    return f"{h[:8]}-{h[8:]}-7"


def uuid7() -> str:
    """A UUIDv7 string (RFC 9562): 48-bit milliseconds, then randomness.

    Within one process ids are strictly increasing: the 12 ``rand_a`` bits
    hold a counter that starts at a random value each millisecond, so ids sort
    by creation time even when many are made in the same millisecond.

    Every enqueue makes one, so it is built cheaply: the millisecond's part
    of the text is formatted once per millisecond (``_prefix``), the rest (counter and
    random bits) in one ``%x``, far fewer instructions than formatting all 128
    bits and slicing them (docs/benchmarks.md, "Figures behind the core's
    choices").
    """
    global _last_ms, _seq, _prefix
    # random (reseeded from os.urandom at start and after fork) is enough: the
    # bits make ids unique, they are not secrets.
    rand = _getrandbits(64)
    with _uuid_lock:
        ms = _time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _seq = seq = rand >> 54  # 10 random bits: leaves room to count up
        else:
            _seq = seq = _seq + 1
            if seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = seq = 0
            ms = _last_ms
    cached = _prefix
    if cached[0] != ms:
        cached = _prefix = (ms, _ms_prefix(ms))
    h = "%019x" % ((seq << 64) | _VARIANT | (rand & _RAND_B))
    return f"{cached[1]}{h[:3]}-{h[3:7]}-{h[7:]}"


def uuid7_many(n: int) -> list[str]:
    """``n`` UUIDv7 strings, as ``n`` calls of ``uuid7`` would make them.

    One clock read and one lock for the whole batch: it reserves ``n``
    consecutive counter values (going on into the next milliseconds when the
    12-bit counter runs out, as ``uuid7`` does), so the ids are strictly
    increasing, among themselves and with every other id of the process.
    Bulk enqueue takes its ids in chunks from here.
    """
    global _last_ms, _seq
    if n <= 0:
        return []
    getrandbits = random.getrandbits
    start = getrandbits(10)  # the counter's random start in a new millisecond
    with _uuid_lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            pos = start
        else:
            ms, pos = _last_ms, _seq + 1
        # positions count on across milliseconds: 4096 counter values in each
        last = pos + n - 1
        _last_ms, _seq = ms + (last >> 12), last & 0xFFF
    out: list[str] = []
    append = out.append
    ms += pos >> 12
    pos &= 0xFFF
    while n > 0:
        h = f"{ms:012x}"
        prefix = f"{h[:8]}-{h[8:]}-7"
        stop = min(0x1000, pos + n)
        for seq in range(pos, stop):
            h = "%019x" % ((seq << 64) | _VARIANT | getrandbits(62))
            append(f"{prefix}{h[:3]}-{h[3:7]}-{h[7:]}")
        n -= stop - pos
        ms, pos = ms + 1, 0
    return out


# -- the envelope ------------------------------------------------------------


@dataclass(slots=True)
class ErrorRecord:
    """One failed attempt, as kept in a message's ``errors`` list."""

    time: float
    type: str
    message: str
    traceback: str = ""
    worker: str = ""
    attempt: int = 0
    #: when the failed attempt started (0: not recorded, e.g. a lost lease),
    #: so its duration (``time - started``) can be shown
    started: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "time": self.time,
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "worker": self.worker,
            "attempt": self.attempt,
        }
        if self.started:
            d["started"] = self.started
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ErrorRecord:
        return cls(
            time=float(d.get("time", 0.0)),
            type=str(d.get("type", "")),
            message=str(d.get("message", "")),
            traceback=str(d.get("traceback", "")),
            worker=str(d.get("worker", "")),
            attempt=int(d.get("attempt", 0)),
            started=float(d.get("started") or 0.0),
        )


@dataclass(slots=True)
class Message:
    """One job or event.  Mutable only in ``attempt``, ``eta``, ``queue`` and
    ``errors``, which brokers update as the message moves."""

    id: str
    kind: str
    name: str
    queue: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0
    max_attempts: int = 1
    created_at: float = 0.0
    eta: float | None = None
    priority: int = 0
    key: str | None = None
    errors: list[ErrorRecord] = field(default_factory=list)

    def copy(self) -> Message:
        """A copy whose containers (args, kwargs, headers, errors) may be
        changed without touching this one: brokers that keep messages in
        memory hand these out.  Field by field, because
        ``dataclasses.replace`` introspects the class on every call (once per
        fetched job)."""
        return Message(
            id=self.id,
            kind=self.kind,
            name=self.name,
            queue=self.queue,
            args=list(self.args),
            kwargs=dict(self.kwargs),
            payload=self.payload,
            headers=dict(self.headers),
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            created_at=self.created_at,
            eta=self.eta,
            priority=self.priority,
            key=self.key,
            errors=list(self.errors),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "queue": self.queue,
            "args": self.args,
            "kwargs": self.kwargs,
            "headers": self.headers,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "created_at": self.created_at,
            "eta": self.eta,
            "priority": self.priority,
            "key": self.key,
            "errors": [e.to_dict() for e in self.errors] if self.errors else [],
        }
        if self.payload is not None:
            d["payload"] = self.payload
        return d


def encode(msg: Message) -> bytes:
    """The envelope as compact JSON bytes (the values were checked at enqueue)."""
    return orjson.dumps(msg.to_dict())


def _dumps_checked(msg: Message, limit: int | None) -> bytes:
    raw = orjson.dumps(msg.to_dict())
    if limit is not None and len(raw) > limit:
        what = "a message of task" if msg.kind == TASK else "an event of type"
        check_size(len(raw), limit, f"{what} {msg.name}")
    return raw


def encode_checked(msg: Message, limit: int | None) -> bytes:
    """``encode``, raising ``PayloadTooLarge`` if the result is over ``limit`` bytes.

    Brokers call this once per message at enqueue, so the size check costs no
    second encoding and still fails the caller's call, before anything is stored.

    The envelope is returned as a copy of its own size: orjson builds every
    result in a buffer of at least 1 KiB (past pymalloc's 512 bytes, so
    glibc's ``malloc``) and shrinks it in place, so the envelopes a bulk
    enqueue holds until its batch is stored sit a memory page or more apart,
    and touching each new page cost more than the encoding (docs/benchmarks.md,
    "Kept envelopes").  A
    small copy is pymalloc's, packed with its neighbours, and orjson's
    buffer is freed at once, for the next envelope to reuse.
    """
    return memoryview(_dumps_checked(msg, limit)).tobytes()


def encode_checked_text(msg: Message, limit: int | None) -> str:
    """``encode_checked`` as text (the same bytes: JSON is UTF-8), for a
    client that sends text as it is: one copy, as ``encode_checked``."""
    return _dumps_checked(msg, limit).decode()


def decode(raw: bytes | str) -> Message:
    """Parse an envelope; raise ``MessageDecodeError`` naming what is wrong."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MessageDecodeError(not_utf8(raw) or f"message body is not JSON: {exc}") from None
    return from_dict(d)


def not_utf8(raw: bytes | str) -> str | None:
    """What makes ``raw`` invalid UTF-8, in a reader's terms, or None if it is valid.

    orjson reports such a body as "str is not valid UTF-8: surrogates not
    allowed", which speaks of a ``str`` the sender never had; this names the
    byte and where it is, so the sender can be found.  Called only for a
    body that already failed to decode.
    """
    if isinstance(raw, str):  # text that came from bytes with errors="surrogateescape"
        if utf8_ok(raw):
            return None
        try:
            body = raw.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return f"message body has {lone_surrogate(raw)}"
    else:
        body = raw
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"message body is not valid UTF-8 (byte 0x{body[exc.start]:02x} at offset "
            f"{exc.start}: {exc.reason}); dumbwaiter messages are UTF-8 JSON"
        )
    return None


def undecodable(raw: bytes | None, problem: str | None) -> str:
    """The dead-letter reason of a body a broker could not decode: the broker's
    ``problem``, unless the body is not even UTF-8 (every broker's JSON
    parser words that as a ``str`` problem; see ``not_utf8``)."""
    return (raw is not None and not_utf8(raw)) or problem or "undecodable message body"


def from_dict(d: Any) -> Message:
    """Build a Message from a decoded envelope, checking the fields that matter."""
    if not isinstance(d, dict):
        raise MessageDecodeError(f"message body is a JSON {type(d).__name__}, not an object")
    try:
        msg = Message(
            id=_req_str(d, "id"),
            kind=_req_str(d, "kind"),
            name=_req_str(d, "name"),
            queue=_queue(d),
            args=list(d.get("args") or []),
            kwargs=dict(d.get("kwargs") or {}),
            payload=d.get("payload"),
            headers=dict(d.get("headers") or {}),
            attempt=int(d.get("attempt", 0)),
            max_attempts=int(d.get("max_attempts", 1)),
            created_at=float(d.get("created_at", 0.0)),
            eta=None if d.get("eta") is None else float(d["eta"]),
            priority=int(d.get("priority", 0)),
            key=d.get("key"),
            errors=[ErrorRecord.from_dict(e) for e in d.get("errors") or []],
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise MessageDecodeError(f"message envelope has a field of the wrong type: {exc}") from None
    if msg.kind not in KINDS:
        raise MessageDecodeError(f"message kind {msg.kind!r} is not one of {KINDS}")
    return msg


def _queue(d: dict[str, Any]) -> str:
    """A job's queue; empty for a published event (the broker fans it out)."""
    value = d.get("queue", "")
    if not isinstance(value, str) or (not value and d.get("kind") != EVENT):
        raise MessageDecodeError("message envelope has no 'queue' string")
    return value


def _req_str(d: dict[str, Any], name: str) -> str:
    value = d.get(name)
    if not isinstance(value, str) or not value:
        raise MessageDecodeError(f"message envelope has no {name!r} string")
    return value


# -- JSON-only arguments -----------------------------------------------------


def check_json(value: Any, where: str) -> None:
    """Raise ``SerializationError`` if ``value`` holds anything JSON cannot carry.

    ``where`` names the value in the error (``"argument 'when' of send_mail"``),
    so the caller sees which argument to fix.  Tuples are allowed and arrive as
    lists, as in every JSON queue.
    """
    problem = _first_problem(value, "")
    if problem is not None:
        path, what = problem
        at = f" at {path}" if path else ""
        raise SerializationError(f"{where}{at} cannot be sent as JSON: {what}")


_PLAIN = frozenset({bool, type(None)})


def _first_problem(value: Any, path: str) -> tuple[str, str] | None:
    t = type(value)
    if t is str:
        return None if utf8_ok(value) else (path, f"the string has {lone_surrogate(value)}")
    if t in _PLAIN:
        return None
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return path, f"the integer {value} does not fit in 64 bits; pass it as a string"
    if t is float:
        if math.isfinite(value):
            return None
        return path, f"{value!r} is not a JSON number"
    if t is list or t is tuple:
        for i, item in enumerate(value):
            p = _first_problem(item, f"{path}[{i}]")
            if p is not None:
                return p
        return None
    if t is dict:
        return _dict_problem(value, path)
    hint = _HINTS.get(t.__name__, "")
    if not hint and isinstance(value, str | int | float):
        hint = f" (a subclass of {type(value).__mro__[-2].__name__}; pass a plain value)"
    return path, f"a {t.__module__}.{t.__qualname__} is not JSON{hint}"


def _dict_problem(value: dict[Any, Any], path: str) -> tuple[str, str] | None:
    for k, item in value.items():
        if type(k) is not str:
            return path, f"the key {k!r} is a {type(k).__name__}; JSON object keys are strings"
        if not utf8_ok(k):
            return path, f"the key {k!r} has {lone_surrogate(k)}"
        p = _first_problem(item, f"{path}[{k!r}]")
        if p is not None:
            return p
    return None


def utf8_ok(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (JSON's encoding).

    Only a lone surrogate (U+D800-U+DFFF) cannot: what ``errors=
    "surrogateescape"`` decoding (file names, ``os.environ``) or a broken
    UTF-16 source leaves in a ``str``.  An ASCII check first, so the common
    text costs no encoding.
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate(text: str) -> str:
    """What is wrong with a ``str`` that ``utf8_ok`` refused, in the caller's terms."""
    i = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
    return (
        f"a lone surrogate {text[i]!r} at index {i}, which UTF-8 (and so "
        "JSON) cannot encode; fix how the text was decoded (e.g. errors='surrogateescape'), "
        "or pass binary data as base64 text"
    )


_HINTS = {
    "datetime": " (pass .isoformat() or a timestamp)",
    "date": " (pass .isoformat())",
    "UUID": " (pass str(value))",
    "Decimal": " (pass str(value))",
    "bytes": " (pass base64 text)",
    "set": " (pass a list)",
    "frozenset": " (pass a list)",
}


def check_size(size: int, limit: int, what: str) -> None:
    """Raise ``PayloadTooLarge`` when an encoded message is over ``limit`` bytes."""
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size:,} bytes encoded, over the maximum of {limit:,} bytes; "
            "store large data elsewhere and pass a reference (or raise max_message_size)"
        )


def dumps(value: Any) -> bytes:
    """JSON bytes of an already checked value (results, headers)."""
    return orjson.dumps(value)


def loads(raw: bytes | str) -> Any:
    return orjson.loads(raw)
