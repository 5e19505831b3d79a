"""The jobs that carry a run: one *segment* at a time.

A run is not one long job.  Each job of the hidden task ``dw.wf:NAME``
replays the workflow function from the start (checkpoints make the replay
cheap) and runs it until it ends or *parks*: a sleep, a wait for an event
or a child, a step's retry delay.  Parking enqueues the next segment (with
an ``eta`` when the wait has a deadline) and hands the run record over to
it (``job``), then the current job succeeds: no worker is held while a run
sleeps, and a sleep costs no attempt.

The run record's ``job`` is a fencing token: a segment whose job is not the
record's ``job`` is stale (superseded by a wake-up, or cancelled) and stops
before its next step.  Wake-ups (an event, a child's end, a signal) take
the record over for a job whose id is derived from the run, its retry epoch
and the parked position, so a waker that runs twice enqueues one job.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import keys
from ..message import TASK, Message, uuid7
from ..retry import Retry
from . import store
from .store import CANCELLED, FINAL, RUN_HEADER, RUNNING, SUCCEEDED, Record

if TYPE_CHECKING:
    from .host import Host

#: the hidden task of workflow NAME is ``dw.wf:NAME``
TASK_PREFIX = keys.RUN_TASK

#: attempts of one segment job, for what is not a step's failure: a worker
#: killed under it (the lease runs out) or the broker failing mid-way.  Steps
#: have their own retry policies, kept in the store, not in these attempts.
SEGMENT_RETRY = Retry(attempts=8, backoff=(1.0, 5.0, 30.0, 60.0, 300.0))


def task_name(workflow: str) -> str:
    return TASK_PREFIX + workflow


def segment_message(
    run: str,
    workflow: str,
    queue: str,
    *,
    id: str | None = None,
    eta: float | None = None,
    priority: int = 0,
) -> Message:
    """A segment job of ``run`` (not its first: that one carries the inputs)."""
    now = time.time()
    return Message(
        id or uuid7(),
        TASK,
        task_name(workflow),
        queue,
        [],
        {},
        None,
        {RUN_HEADER: run, "correlation_id": run},
        0,
        SEGMENT_RETRY.attempts,
        now,
        eta if eta is not None and eta > now else None,
        priority,
        None,
        [],
    )


async def send(app: Host, msgs: list[Message]) -> None:
    """Enqueue through the app (its enqueue middleware sees them)."""
    await app._send(msgs)


async def wake(app: Host, run: str, pos: int) -> bool:
    """Resume ``run`` if it is parked at ``pos`` (its checkpoint there is
    written): hand the record to the wake job and enqueue that job.  True if
    the run was (or already had been) woken from ``pos``.

    Safe to repeat: a second call finds the record already handed to the
    same derived job and enqueues it again, which the broker stores once."""
    found: dict[str, str] = {}

    def change(rec: Record) -> Record | None:
        if rec.get("status") in FINAL:
            return None
        job = store.wake_job_id(run, int(rec.get("epoch") or 0), pos)
        if rec.get("job") == job:
            found["job"] = job
            return None
        if rec.get("parked_at") != pos:
            return None
        found["job"] = job
        rec.update(job=job, status=RUNNING, parked_at=None, wake_at=None, waiting=None)
        return rec

    _, rec = await store.update(app.broker, run, change)
    if "job" not in found or rec is None:
        return False
    await send(app, [resume_message(rec, found["job"])])
    return True


def resume_message(rec: Record, job: str, eta: float | None = None) -> Message:
    return segment_message(
        str(rec["id"]),
        str(rec["workflow"]),
        str(rec.get("queue") or "default"),
        id=job,
        eta=eta,
        priority=int(rec.get("priority") or 0),
    )


def run_of(msg: Message) -> str:
    """The run a segment job works on."""
    value: Any = msg.headers.get(RUN_HEADER)
    return str(value) if value else msg.id


async def notify_parent(app: Host, rec: Record) -> None:
    """Tell the parent run (if any) how this child ended: its checkpoint at the
    position that started the child, then a wake-up.  Idempotent."""
    parent = rec.get("parent")
    if not isinstance(parent, dict) or not parent.get("run"):
        return
    status = rec.get("status")
    ck: dict[str, Any] = {
        "n": parent.get("name"),
        "k": "child",
        "run": rec.get("id"),
        "t1": rec.get("finished_at") or time.time(),
    }
    if status == SUCCEEDED:
        ck["v"] = rec.get("result")
    else:
        err = dict(rec.get("error") or {})
        if status == CANCELLED:
            err = {
                "type": "dumbwaiter.WorkflowCancelled",
                "message": f"child run {rec['id']} was cancelled",
            }
        err.pop("traceback", None)
        ck["e"] = err
    prun, ppos = str(parent["run"]), int(parent["pos"])
    await app.broker.kv_add(store.ck_key(prun, ppos), store.dumps(ck))
    await wake(app, prun, ppos)
