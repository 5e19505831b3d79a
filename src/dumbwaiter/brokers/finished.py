"""What a succeeded job keeps: its whole record, or a compact one.

A succeeded task that keeps no result (no ``keep_result``) is read later
only for its state (``job.status()``, a workflow's step, a durable run's
first job), the de-duplication of its id (an outbox relay sending a batch
again) and a line in a listing (id, task, queue, state, when it ran).
Nothing reads its arguments, headers or error history once it succeeded:
counters and the dashboard's throughput come from aggregates.  So each
engine keeps, for the retention, only a *compact record* of it: id, task,
queue, state, attempt, started and finished, no body.  ``JobInfo.compact`` says a
record is one (its message then has no args, kwargs, headers or errors).

Where each engine writes it: the SQL engines' ack (the body shrinks to
``COMPACT_PREFIX``), Redis' ``ack.lua``, the memory store (``compacted``),
the record engines' ``transitions.succeed`` (RabbitMQ and Kafka:
``Record.compact``) and NATS' ``records.compact_record``.

Kept whole: a task with ``keep_result`` (its result and its record), an
event's delivery (the dashboard's events page finds its event through the
``event_id`` header), and every job that did not succeed; on Redis,
RabbitMQ, Kafka and NATS also a job holding a unique key (its record keeps
the key: what frees it, and what a search by key finds).  The bytes each
engine keeps per finished job are in docs/benchmarks.md ("What finished jobs
cost the broker").
"""

from __future__ import annotations

import orjson

from ..message import TASK, Message
from .types import Delivery

#: the body the SQL engines store for a compact record: ``{"c":1,"name":...}``
#: (the queue, attempt and times are columns of the row)
COMPACT_PREFIX = b'{"c":1,'


def compacts(d: Delivery) -> bool:
    """Whether a successful delivery leaves only a compact record."""
    m = d.message
    return d.result_ttl is None and m is not None and m.kind == TASK


def compact_message(id: str, name: str, queue: str, attempt: int = 1) -> Message:
    """The message a compact record shows: who and where, no arguments."""
    return Message(id=id, kind=TASK, name=name, queue=queue, attempt=attempt)


def compacted(m: Message) -> Message:
    """``m`` without its arguments, headers and errors (the memory engine's
    compact record); its key stays, which the engine's unique keys read."""
    out = compact_message(m.id, m.name, m.queue, m.attempt)
    out.max_attempts, out.created_at, out.priority, out.key = (
        m.max_attempts,
        m.created_at,
        m.priority,
        m.key,
    )
    return out


def started_only(result: bytes | None) -> float | None:
    """When ``result`` is only the worker's timing of the attempt (a task
    without ``keep_result``: ``settle.result_record``), the time it started;
    else None (the result is kept as it is)."""
    if result is None or not result.startswith(b'{"started":'):
        return None
    d = orjson.loads(result)
    if d.keys() == {"started", "finished"} and isinstance(d["started"], float):
        return float(d["started"])
    return None
