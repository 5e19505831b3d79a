"""Rows of the PostgreSQL broker: from envelopes to COPY rows, from rows to deliveries."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
from psycopg.adapt import PyFormat

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message
from ...message import from_dict as message_from_dict
from ...state import State
from ..base import (
    Delivery,
    JobInfo,
)

#: field names of a stored row (see PostgresBroker._row), as query parameters
ROW_FIELDS = ("id", "queue", "name", "kind", "priority", "max_attempts", "key", "body", "eta")
#: the cursor of a first page of events
NIL_UUID = "00000000-0000-0000-0000-000000000000"

#: the types psycopg writes a COPY row as (binary format).  The id goes as the
#: 16 bytes of the UUID, typed bytea here: the binary form of a uuid column is
#: those bytes, and this avoids building a uuid.UUID per job.
COPY_TYPES = ["bytea", "text", "text", "text", "int4", "int4", "text", "bytea"]


def fast_bytea(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """COPY picks dumpers by column type, and for bytea psycopg's lookup by type
    finds its pure-Python DB-API ``Binary`` dumper; this cursor gets the
    (C, where psycopg has it) dumper of ``bytes`` instead."""
    cur.adapters.register_dumper(bytes, cur.adapters.get_dumper(bytes, PyFormat.BINARY))


def binary_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (bytes.fromhex(r[0].replace("-", "")), r[1], r[2], r[3], r[4], r[5], r[6], r[7])


def merge_ids(
    kept: list[tuple[Any, ...]], later: list[tuple[Any, ...]], held: list[str]
) -> list[str]:
    """The ids of a COPY batch whose scheduled rows were inserted apart."""
    by_row = {id(r): i for r, i in zip(later, held, strict=True)}
    return [by_row.get(id(r), r[0]) for r in kept]


def is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def message_of(body: bytes, queue: str, attempt: int, errors: str | None) -> Message:
    d = orjson.loads(body)
    d["queue"] = queue
    d["attempt"] = attempt
    d["errors"] = orjson.loads(errors) if errors else []
    return message_from_dict(d)


def delivery_row(row: Any, token: int) -> Delivery:
    id_, queue, attempt, body, errors = row[:5]
    try:
        msg: Message | None = message_of(body, queue, attempt, errors)
        problem = None
    except (orjson.JSONDecodeError, MessageDecodeError) as exc:
        msg, problem = None, str(exc)
    return Delivery(
        id=id_,
        message=msg,
        token=token,
        lease_until=row[7],
        queue=queue,
        raw=None if msg is not None else bytes(body),
        decode_error=problem,
    )


def info_row(row: Any) -> JobInfo:
    (
        id_,
        queue,
        state,
        attempt,
        body,
        errors,
        run_at,
        updated_at,
        worker,
        lease,
        result,
        replays,
    ) = row
    raw = None
    try:
        msg = message_of(body, queue, attempt, errors)
    except (orjson.JSONDecodeError, MessageDecodeError):
        raw = bytes(body)
        msg = Message(
            id=id_,
            kind="task",
            name="?",
            queue=queue,
            attempt=attempt,
            errors=[ErrorRecord.from_dict(e) for e in orjson.loads(errors)] if errors else [],
        )
    st = State(state)
    if st is State.SCHEDULED and attempt > 0:
        st = State.RETRYING
    return JobInfo(
        message=msg,
        state=st,
        run_at=run_at,
        updated_at=updated_at,
        worker=worker,
        lease_until=lease,
        result=None if result is None else bytes(result),
        replays=replays,
        raw=raw,
    )


def err_json(d: Delivery) -> str | None:
    return None if d.error is None else orjson.dumps(d.error.to_dict()).decode()
