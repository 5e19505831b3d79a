"""Rows of the SQL brokers (SQLite, PostgreSQL) as the seam's objects.

Both store a job as the same columns (id, queue, state, attempt, body,
errors, run_at, updated_at, worker, lease_until, result, replays) with the
envelope in ``body`` and the fields that change (queue, attempt, errors) in
columns of their own, so reading one back is the same code: the body with
those columns laid over it.  A body that does not decode is not an error
here: a delivery carries it raw with the reason (the worker dead-letters
it), a listing shows what the row itself says.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message, decode
from ...message import from_dict as message_from_dict
from ...state import State
from ..finished import COMPACT_PREFIX, compact_message
from ..types import Delivery, JobInfo, Page


def message_of(body: bytes, queue: str, attempt: int, errors: str | None) -> Message:
    """A stored job's envelope, with its row's queue, attempt and errors.

    A body that is JSON but not an object (a foreign producer's row) is a
    ``MessageDecodeError`` like any other undecodable body, never a
    ``TypeError`` that would fail the whole claim it came in."""
    d = orjson.loads(body)
    if not isinstance(d, dict):
        raise MessageDecodeError(f"message body is a JSON {type(d).__name__}, not an object")
    d["queue"] = queue
    d["attempt"] = attempt
    d["errors"] = orjson.loads(errors) if errors else []
    return message_from_dict(d)


def stored_message(body: bytes, queue: str, attempt: int, errors: str | None) -> Message | None:
    """A stored job's envelope, or None when its body does not decode."""
    try:
        return message_of(body, queue, attempt, errors)
    except (orjson.JSONDecodeError, MessageDecodeError):
        return None


def delivery_row(row: Sequence[Any], token: int, lease_until: float | None = None) -> Delivery:
    """A claimed row (id, queue, attempt, body, errors, ...) as a delivery
    under ``token``; the lease ends at ``lease_until``, or, when None, at
    the row's eighth column (PostgreSQL returns it from the claim)."""
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
        lease_until=row[7] if lease_until is None else lease_until,
        queue=queue,
        raw=None if msg is not None else bytes(body),
        decode_error=problem,
    )


def info_row(row: Sequence[Any]) -> JobInfo:
    """A row of the job columns above as what ``get`` and listings return."""
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
    compact = bytes(body[: len(COMPACT_PREFIX)]) == COMPACT_PREFIX
    try:
        if compact:
            c = orjson.loads(body)
            msg = compact_message(id_, str(c.get("name", "?")), queue, attempt)
            msg.key = c.get("key")  # the key search and unique ticks read it
        else:
            msg = message_of(body, queue, attempt, errors)
    except (orjson.JSONDecodeError, MessageDecodeError):
        # keep what the row itself says, so the dead letter shows why it died
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
        compact=compact,
    )


def err_json(d: Delivery) -> str | None:
    """A delivery's error record as the JSON text its row stores."""
    return None if d.error is None else orjson.dumps(d.error.to_dict()).decode()


def is_uuid(value: str) -> bool:
    """Whether ``value`` is a job id as the engines store them (a malformed
    one matches no job, rather than failing a statement)."""
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def jobs_page(rows: Sequence[Sequence[Any]], limit: int) -> Page:
    """A listing's page from the first ``limit + 1`` matching rows (the one
    more says that another page follows, after the last id shown)."""
    items = [info_row(r) for r in rows[:limit]]
    return Page(items=items, cursor=items[-1].message.id if len(rows) > limit else None)


def events_page(rows: Sequence[Sequence[Any]], limit: int) -> tuple[list[Message], str | None]:
    """A page of the event log from the first ``limit + 1`` (id, body) rows,
    with the cursor of the next page (None: this is the last)."""
    page = [decode(bytes(body)) for _, body in rows[:limit]]
    return page, (page[-1].id if len(rows) > limit else None)
