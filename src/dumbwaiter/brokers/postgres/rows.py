"""Rows of the PostgreSQL broker: from envelopes to COPY rows, from rows to deliveries."""

from __future__ import annotations

import struct
from typing import Any

import orjson
import psycopg

from ..sql.rows import delivery_row
from ..types import Delivery

#: field names of a stored row (see PostgresBroker._row), as query parameters
ROW_FIELDS = (
    "id",
    "queue",
    "name",
    "kind",
    "priority",
    "max_attempts",
    "key",
    "body",
    "eta",
    "msg_key",
)
#: the cursor of a first page of events
NIL_UUID = "00000000-0000-0000-0000-000000000000"


# PostgreSQL's binary COPY format (the COPY documentation, "Binary Format"):
# a signature, flags and header-extension length; per row a 16-bit field
# count, then per field a 32-bit length (-1: NULL) and the value's binary
# form; a 16-bit -1 at the end.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
_TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
#: a row's field count (9, COPY's columns) and its first field's length: a uuid is 16 bytes
_ROW_HEAD = b"\x00\x09\x00\x00\x00\x10"
_int4 = struct.Struct("!i").pack
#: the size of the pieces handed to COPY (psycopg's writers pass up to 128 KiB as one)
COPY_CHUNK = 64 * 1024


class CopyRows:
    """The rows of a bulk enqueue as binary ``COPY`` data, made here rather
    than by psycopg's ``write_row``.

    Why: psycopg formats each row through a few Python calls and a dumper per
    field, as costly as building the job's message (docs/benchmarks-postgres.md,
    "COPY rows built as bytes").  Of the nine columns only the id, the
    keys and the body vary within a batch: the queue, name, kind, priority and
    max_attempts of a row are formatted once per distinct combination and
    reused, so a row is a few byte strings joined.  A priority or max_attempts outside int4
    raises ``psycopg.DataError`` (the COPY is abandoned, nothing is stored),
    as the insert of a smaller batch does ("integer out of range"); psycopg's
    binary int4 dumper wrapped such a value around instead.

    Text is encoded in the connection's client encoding (what the server's
    binary input of ``text`` expects).
    """

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._fixed: dict[tuple[Any, ...], bytes] = {}
        self._parts: list[bytes] = [_SIGNATURE]
        self._size = len(_SIGNATURE)

    def _text(self, value: str) -> bytes:
        raw = value.encode(self._encoding)
        return _int4(len(raw)) + raw

    def _fields(self, k: tuple[Any, ...]) -> bytes:
        queue, name, kind, priority, max_attempts = k
        try:
            ints = _int4(4) + _int4(priority) + _int4(4) + _int4(max_attempts)
        except struct.error as exc:
            raise psycopg.DataError(
                f"priority or max_attempts out of int4 range: {priority!r}, {max_attempts!r}"
            ) from exc
        fixed = self._text(queue) + self._text(name) + self._text(kind) + ints
        self._fixed[k] = fixed
        return fixed

    def add(self, r: tuple[Any, ...]) -> bytes | None:
        """Append one stored row (see ``PostgresBroker._row``); return a chunk
        to send once at least ``COPY_CHUNK`` bytes have gathered."""
        ident = bytes.fromhex(r[0].replace("-", ""))
        if len(ident) != 16:
            raise ValueError(f"a job id must be a UUID, not {r[0]!r}")
        k = (r[1], r[2], r[3], r[4], r[5])
        fixed = self._fixed.get(k) or self._fields(k)
        key, body, msg_key = r[6], r[7], r[9]
        size = len(body)
        held = _NULL if key is None else self._text(key)
        self._parts += (
            _ROW_HEAD,
            ident,
            fixed,
            held,
            # a task's message key is its unique key: encoded once
            held if msg_key is key else (_NULL if msg_key is None else self._text(msg_key)),
            _int4(size),
            body,
        )
        self._size += size + 80
        if self._size < COPY_CHUNK:
            return None
        return self.take()

    def take(self) -> bytes:
        """What has gathered since the last chunk."""
        data = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        return data

    def end(self) -> bytes:
        """The last chunk, with the format's trailer."""
        self._parts.append(_TRAILER)
        return self.take()


def merge_ids(
    kept: list[tuple[Any, ...]], later: list[tuple[Any, ...]], held: list[str]
) -> list[str]:
    """The ids of a COPY batch whose scheduled rows were inserted apart."""
    by_row = {id(r): i for r, i in zip(later, held, strict=True)}
    return [by_row.get(id(r), r[0]) for r in kept]


def handed(payload: str) -> tuple[int, Delivery | None]:
    """A handoff NOTIFY's payload (queries.enqueue_hand): the waiter's token
    and the job handed to it, stored as a claim would have left it (attempt
    1, the token, the lease); None for a waiter whose producer stored nothing.

    The payload is a JSON array (token, id, queue, lease end), a newline and
    the envelope as stored (JSON has no raw newline in its text)."""
    head, _, body = payload.partition("\n")
    fields = orjson.loads(head)
    token = int(fields[0])
    if len(fields) < 4:
        return token, None
    id_, queue, lease_until = fields[1], fields[2], fields[3]
    return token, delivery_row((id_, queue, 1, body.encode(), None, 0, 0.0, lease_until), token)
