"""The job state machine of the engines that keep job records in a
key-value store (RabbitMQ's ledger, Kafka's records: ``record.py``).

A job's life is the same on every engine; only where the machine runs
differs.  The SQL engines (SQLite, PostgreSQL) and Redis move a job inside
the server, atomically, in SQL and Lua; the record engines move it here,
inside the state store's atomic ``kv_update`` (each function is pure: it
changes the record it is given, reads nothing else, and may run twice).
docs/design.md has the table of states and transitions, and the file where
each engine encodes it.

Each transition says whether it applies: False (None for the ones that
answer a state) is a refusal, and the record is left as it was.  Who may
settle a running job is fenced by its lease's token (``holds``): a worker
whose lease ran out, and was rescued or taken over since, settles nothing.
``now`` is always the state store's clock (``clock.py``); ``at`` likewise.

What stays the engine's: which copy of a job is current (versions, the
copies sent after a change) and how long a record is kept after a change
that is not a success (a cancelled record outlives its queued copy).
"""

from __future__ import annotations

from ..errors import LeaseExpired
from ..message import ErrorRecord
from ..state import CANCELLABLE_STATES, State
from .finished import compact_message
from .record import Record

#: stored states whose record waits for a copy to be taken (``retrying`` is
#: a ``scheduled`` record of a job that failed before: ``Record.shown_state``)
WAITING = frozenset({State.READY, State.SCHEDULED})
#: why a lease ran out, in its ``LeaseExpired`` error, when a rescue finds it
STOPPED_HEARTBEATING = "stopped heartbeating"


def holds(rec: Record, token: int) -> bool:
    """The lease fence: whether ``rec`` is running under the lease ``token``
    (a worker that lost its lease holds an older token, or none)."""
    return rec.state is State.RUNNING and rec.token == token


def expired(rec: Record, now: float) -> bool:
    """Whether ``rec`` runs under a lease that ran out (its worker died or hung)."""
    return rec.state is State.RUNNING and rec.lease_until <= now


def cancellable(rec: Record, now: float) -> bool:
    """Whether ``rec`` still waits (scheduled, ready, retrying): what an
    admin call may cancel or reschedule."""
    return rec.shown_state(now) in CANCELLABLE_STATES


def take_lease(rec: Record, until: float, worker: str, now: float) -> bool:
    """Waiting (or running under an expired lease, taken over: ``lose_lease``
    first) -> running until ``until``: the next attempt, a new fencing token."""
    if rec.state not in WAITING and not expired(rec, now):
        return False
    rec.state = State.RUNNING
    rec.msg.attempt += 1
    rec.token += 1
    rec.lease_until = until
    rec.worker = worker or None
    rec.updated_at = now
    return True


def extend(rec: Record, token: int, until: float) -> bool:
    """A heartbeat: the lease ``token`` holds now runs until ``until``."""
    if not holds(rec, token):
        return False
    rec.lease_until = until
    return True


def succeed(
    rec: Record, token: int, now: float, result: bytes | None = None, compact: bool = False
) -> bool:
    """Running under ``token`` -> succeeded, with its result (kept
    ``kept_for``).  ``compact``: the job keeps no result (``finished.compacts``),
    so only a compact record is kept (``Record.compact``), unless the job
    holds a unique key: the key is kept as long as the job's whole record,
    as on Redis."""
    if not holds(rec, token):
        return False
    rec.state = State.SUCCEEDED
    rec.updated_at = now
    rec.result = result
    if compact and rec.raw is None and rec.msg.key is None:
        m = rec.msg
        rec.msg = compact_message(m.id, m.name, m.queue, m.attempt)  # the held one stays
        rec.compact = True
    return True


def kept_for(retention: float, result: bytes | None, result_ttl: float | None) -> float:
    """Seconds a succeeded record is kept: ``retention``, or its result's own
    time (``keep_result``) when that is longer."""
    if result is not None and result_ttl:
        return max(result_ttl, retention)
    return retention


def retry(rec: Record, token: int, at: float, now: float, error: ErrorRecord | None) -> bool:
    """Running under ``token`` -> waiting again from ``at`` (scheduled, shown
    as retrying; ready when ``at`` is past), the failed attempt's error kept."""
    if not holds(rec, token):
        return False
    if error is not None:
        rec.msg.errors.append(error)
    _wait_from(rec, at, now)
    return True


def requeue(rec: Record, token: int, at: float, now: float) -> bool:
    """Running under ``token`` -> waiting again from ``at``, the attempt not
    counted (the worker gave it back: shutdown, a concurrency limit)."""
    if not holds(rec, token):
        return False
    rec.msg.attempt = max(0, rec.msg.attempt - 1)
    _wait_from(rec, at, now)
    return True


def bury(rec: Record, token: int, now: float, error: ErrorRecord | None) -> bool:
    """Running under ``token`` -> dead (its copies stale), the error kept."""
    if not holds(rec, token):
        return False
    if error is not None:
        rec.msg.errors.append(error)
    _dead(rec, now)
    return True


def lease_error(rec: Record, now: float, why: str = STOPPED_HEARTBEATING) -> ErrorRecord:
    """The error a job whose lease ran out records for its lost attempt, in
    the words every engine uses."""
    return ErrorRecord(
        time=now,
        type=f"dumbwaiter.errors.{LeaseExpired.__name__}",
        message=f"lease expired: worker {rec.worker or '?'} {why} during attempt {rec.msg.attempt}",
        worker=rec.worker or "",
        attempt=rec.msg.attempt,
    )


def lose_lease(rec: Record, now: float, why: str = STOPPED_HEARTBEATING) -> State | None:
    """An expired lease's attempt recorded as lost (a ``LeaseExpired`` error).

    None: refused (no expired lease).  ``DEAD``: that was the last attempt,
    and the record is dead.  ``RUNNING``: the record still says running
    under the expired lease, for the caller to make it wait again
    (``rescue``) or lease it over (``take_lease``: a takeover by the copy the
    lost worker held, which stays current)."""
    if not expired(rec, now):
        return None
    rec.msg.errors.append(lease_error(rec, now, why))
    if rec.msg.attempt >= rec.msg.max_attempts:
        _dead(rec, now)
        return State.DEAD
    return State.RUNNING


def rescue(rec: Record, now: float, why: str = STOPPED_HEARTBEATING) -> State | None:
    """Running under an expired lease -> ready now (a new copy's version), or
    dead when its attempts are spent: the new state, None if refused."""
    lost = lose_lease(rec, now, why)
    if lost is State.RUNNING:
        _wait_from(rec, now, now)
        return State.READY
    return lost


def cancel(rec: Record, now: float) -> bool:
    """Waiting (scheduled, ready, retrying) -> cancelled; its copies stale."""
    if not cancellable(rec, now):
        return False
    rec.state = State.CANCELLED
    rec.updated_at = now
    rec.ver += 1
    return True


def reschedule(rec: Record, at: float, now: float) -> bool:
    """Waiting -> waiting from ``at`` (a new copy's version)."""
    if not cancellable(rec, now):
        return False
    _wait_from(rec, at, now)
    return True


def replay(rec: Record, now: float) -> bool:
    """Dead -> ready now, with fresh attempts (a new copy's version)."""
    if rec.state is not State.DEAD:
        return False
    rec.msg.attempt = 0
    rec.replays += 1
    _wait_from(rec, now, now)
    return True


def _wait_from(rec: Record, at: float, now: float) -> None:
    """Waiting again for a new copy (its version), due at ``at`` (now if
    past).  The worker stays, as the last that ran it (as in the SQL
    engines); the lease goes."""
    rec.ver += 1
    rec.run_at = max(at, now)
    rec.state = State.SCHEDULED if at > now else State.READY
    rec.updated_at = now
    rec.lease_until = 0.0


def _dead(rec: Record, now: float) -> None:
    rec.state = State.DEAD
    rec.updated_at = now
    rec.ver += 1
