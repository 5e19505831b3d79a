"""One ``JobFilter`` -> SQL ``WHERE`` builder for both SQL engines.

SQLite and PostgreSQL store a job as the same columns (see rows.py), so an
admin filter (``list_jobs``, ``replay``, ``purge``) is the same conditions
in both; what differs is spelled by a ``Dialect``: the placeholder, how a
list of ids is passed, how a time is compared and how a key is found (each
engine's key index is laid out its own way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ...state import State
from ..types import JobFilter, normalize_error_type
from .rows import is_uuid


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one engine spells the parts of a filter that differ."""

    #: a positional parameter
    p: str
    #: the condition on ``id`` for a list of ids, and its one parameter
    ids: Callable[[Sequence[str]], tuple[str, Any]]
    #: the condition for ``Message.key == key``, and its parameters
    key: Callable[[str], tuple[str, list[Any]]]
    #: a time parameter (seconds since the epoch) as the column's type
    time: str
    #: the condition "``last_error_type`` ends with ``.NAME``", and its
    #: parameters for the dotted name ``.NAME``
    suffix: Callable[[str], tuple[str, list[Any]]]


def where(f: JobFilter, d: Dialect) -> tuple[str, list[Any]]:
    """SQL conditions (positional parameters) for an admin filter."""
    p = d.p
    clauses = ["1=1"]
    params: list[Any] = []
    if f.queue is not None:
        clauses.append(f"queue = {p}")
        params.append(f.queue)
    if f.name is not None:
        clauses.append(f"name = {p}")
        params.append(f.name)
    if f.state is not None:
        if f.state is State.RETRYING:
            clauses.append("state = 'scheduled' AND attempt > 0")
        elif f.state is State.SCHEDULED:
            clauses.append("state = 'scheduled' AND attempt = 0")
        else:
            clauses.append(f"state = {p}")
            params.append(str(f.state))
    if f.ids is not None:
        clause, value = d.ids(f.ids)
        clauses.append(clause)
        params.append(value)
    if f.key is not None:
        clause, values = d.key(f.key)
        clauses.append(clause)
        params += values
    if f.since is not None:
        clauses.append(f"updated_at >= {d.time}")
        params.append(f.since)
    if f.until is not None:
        clauses.append(f"updated_at <= {d.time}")
        params.append(f.until)
    if f.error_type is not None:
        wanted = normalize_error_type(f.error_type)
        clause, values = d.suffix("." + wanted)
        clauses.append(f"(last_error_type = {p} OR {clause})")
        params += [wanted, *values]
    return " AND ".join(clauses), params


SQLITE = Dialect(
    p="?",
    ids=lambda ids: ("id IN (SELECT value FROM json_each(?))", orjson.dumps(list(ids))),
    # a probe of dw_jobs_msg_key: msg_key holds every job's message key (the
    # key column only a unique key while it is held), and the index's id
    # order serves a listing's ORDER BY id DESC LIMIT as it is
    key=lambda key: ("msg_key = ?", [key]),
    time="?",
    suffix=lambda dotted: ("substr(last_error_type, -length(?)) = ?", [dotted, dotted]),
)

POSTGRES = Dialect(
    p="%s",
    # a malformed id matches nothing (a cast would fail the whole statement)
    ids=lambda ids: ("id = ANY(%s::uuid[])", [i for i in ids if is_uuid(i)]),
    # two index probes (migration 0006): a job that holds its key has it in
    # key (unique index dw_jobs_key); every other job with a key (a holder a
    # newer unique job freed, an event delivery) has key NULL and its message
    # key in msg_key, which dw_jobs_msg_key indexes for exactly those rows, so
    # a keyed job pays no second index entry at enqueue
    key=lambda key: ("(key = %s OR (msg_key = %s AND key IS NULL))", [key, key]),
    time="to_timestamp(%s)",
    suffix=lambda dotted: ("right(last_error_type, %s) = %s", [len(dotted), dotted]),
)
