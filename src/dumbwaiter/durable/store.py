"""Where a durable run lives: entries in the broker's key-value store.

Every broker has the kv seam (``kv_get``, ``kv_set``, ``kv_add``,
``kv_update``...), shared by every process of the app, so a run is stored
the same way on SQLite, Redis, PostgreSQL, RabbitMQ (its state store) and
NATS, and needs no new server:

* ``wfrun:RUN``: the run record (one JSON object, ``Record``): its workflow,
  version, inputs, status, the job that currently owns it, where it is
  parked, its result or error.  Changed only by ``kv_update`` (atomic), so a
  cancel, a wake-up and a segment parking cannot lose each other's writes.
* ``wfck:RUN:POS``: the checkpoint of the operation at position ``POS``
  (a step's result or final error, a sleep's wake time, the event a wait
  received, ``now()``, ``uuid()``...), written once with ``kv_add``: when
  two replays race, the first writer wins and the other adopts its value.
* ``wftry:RUN:POS``: the failed attempts of a step still being retried.
* ``wfpend:RUN:POS``: a wait under way (its deadline), so a replay keeps the
  deadline the first execution chose.
* ``wfwait:TYPE:SHAPE:VALUES:RUN:POS`` and ``wfshape:TYPE:SHAPE``: waiters
  of an event type, indexed by what they match (see ``events.py``).

The prefixes are not ``wf:``, which the chains of ``workflow.py`` use.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from .. import keys
from ..brokers.base import Broker, KvWrite
from ..workflow import derived_id

RUN = keys.RUN
CHECKPOINT = keys.RUN_CHECKPOINT
TRIES = keys.RUN_TRIES
PENDING = keys.RUN_PENDING
WAITER = keys.RUN_WAITER
SHAPE = keys.RUN_SHAPE

#: header of a run's job: the run it works on (a run's first job has the
#: run's id as its own id and may carry no header)
RUN_HEADER = "wfrun"
#: header of a child run's first job: the parent run and the position waiting for it
PARENT_HEADER = "wfparent"

#: run states
PENDING_STATE = "pending"  # enqueued, no worker has started it yet
RUNNING, SLEEPING, WAITING = "running", "sleeping", "waiting"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
STATES = (PENDING_STATE, RUNNING, SLEEPING, WAITING, SUCCEEDED, FAILED, CANCELLED)

#: finished runs (record and checkpoints) are kept this long by default: 7 days
DEFAULT_RETENTION = 7 * 86400.0

Record = dict[str, Any]


def run_key(run: str) -> str:
    return RUN + run


def ck_key(run: str, pos: int | str) -> str:
    """Checkpoint key; positions are zero-padded so a scan lists them in order
    (compensations are ``c`` + the position of the step they undo)."""
    return f"{CHECKPOINT}{run}:{pos:06d}" if isinstance(pos, int) else f"{CHECKPOINT}{run}:{pos}"


def try_key(run: str, pos: int | str) -> str:
    return f"{TRIES}{run}:{pos:06d}" if isinstance(pos, int) else f"{TRIES}{run}:{pos}"


def pend_key(run: str, pos: int) -> str:
    return f"{PENDING}{run}:{pos:06d}"


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(raw: bytes | None) -> Any:
    return None if raw is None else orjson.loads(raw)


def short_hash(value: Any) -> str:
    """A stable 16-hex-digit digest of a JSON value (sorted keys)."""
    data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def new_record(
    run: str,
    workflow: str,
    version: int,
    args: list[Any],
    kwargs: dict[str, Any],
    job: str,
    queue: str,
    parent: dict[str, Any] | None,
) -> Record:
    now = time.time()
    return {
        "id": run,
        "workflow": workflow,
        "version": version,
        "args": args,
        "kwargs": kwargs,
        "status": RUNNING,
        "job": job,
        "queue": queue,
        "epoch": 0,
        "created_at": now,
        "updated_at": now,
        "parent": parent,
    }


def wake_job_id(run: str, epoch: int, pos: int) -> str:
    """The job that resumes ``run`` parked at ``pos``: derived, so every
    waker (an event delivered twice, a child's completion repeated after a
    crash) enqueues the same job, which the broker stores once."""
    return derived_id("wfwake", run, str(epoch), str(pos))


def retry_job_id(run: str, epoch: int) -> str:
    return derived_id("wfretry", run, str(epoch))


def child_run_id(parent: str, epoch: int, name: str) -> str:
    return derived_id("wfchild", parent, str(epoch), name)


def keyed_run_id(workflow: str, key: str) -> str:
    """The run id of ``options(key=...)``: one run per workflow and key."""
    return derived_id("wfkey", workflow, key)


async def load(broker: Broker, run: str) -> Record | None:
    raw = (await broker.kv_get([run_key(run)])).get(run_key(run))
    return None if raw is None else dict(loads(raw))


async def update(
    broker: Broker,
    run: str,
    change: Callable[[Record], Record | None],
    ttl: float | None = None,
) -> tuple[bool, Record | None]:
    """Change the run record atomically: ``change`` gets a copy of the stored
    record and returns the new one (None: leave it).  Returns (changed, the
    record as it now is).  ``ttl`` keeps the new record that long (final
    states); otherwise it has no expiry."""
    key = run_key(run)

    def decide(found: dict[str, bytes]) -> tuple[Mapping[str, KvWrite], tuple[bool, Record | None]]:
        raw = found.get(key)
        if raw is None:
            return {}, (False, None)
        rec = dict(orjson.loads(raw))
        new = change(dict(rec))
        if new is None:
            return {}, (False, rec)
        new["updated_at"] = time.time()
        data = orjson.dumps(new)
        return {key: (data, ttl) if ttl is not None else data}, (True, new)

    return await broker.kv_update([key], decide)


def public_status(rec: Record, now: float | None = None) -> str:
    """The status a person is shown: a sleeping run whose wake time has come is
    ``running`` (its job is due, or started), however the record still reads."""
    status = str(rec.get("status"))
    if status == SLEEPING:
        wake = rec.get("wake_at")
        if isinstance(wake, int | float) and wake <= (time.time() if now is None else now):
            return RUNNING
    return status


def error_record(exc: BaseException, step: str | None = None) -> dict[str, Any]:
    """A failure as stored (type name, message; the traceback trimmed)."""
    import traceback

    t = type(exc)
    module = t.__module__
    name = t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"
    tb = "".join(traceback.format_exception(exc)) if exc.__traceback__ is not None else ""
    out: dict[str, Any] = {"type": name, "message": str(exc), "traceback": tb[-4000:]}
    if step is not None:
        out["step"] = step
    out["time"] = time.time()
    return out
