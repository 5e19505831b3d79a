"""Operations on runs: list, describe, cancel, retry, signal.

What ``dumbwaiter workflows`` and the ``WorkflowRun`` handle call.  They
need no workflow code (a CLI with only ``--url`` can use them), except that
``signal`` validates the payload against the event class when this process
knows it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..message import check_json, uuid7
from ..state import FINAL_STATES as FINAL_JOB_STATES
from ..state import State
from . import events, store
from .errors import WorkflowNotFound, WorkflowStateError
from .jobs import TASK_PREFIX, notify_parent, resume_message, send
from .store import (
    CANCELLED,
    CHECKPOINT,
    FAILED,
    FINAL,
    PENDING,
    PENDING_STATE,
    RUN,
    RUNNING,
    TRIES,
    Record,
)

if TYPE_CHECKING:
    from .host import Host


async def status(app: Host, run: str) -> str:
    rec = await store.load(app.broker, run)
    if rec is not None:
        return store.public_status(rec)
    if await first_job_pending(app, run):
        return PENDING_STATE
    raise WorkflowNotFound(f"no workflow run {run} is stored (never started, or pruned)")


async def first_job_pending(app: Host, run: str) -> bool:
    """Whether the run's first job is stored and has not ended: a run with no
    record yet is pending; one whose first job ended has had its record
    pruned (or its job was cancelled before it ran)."""
    info = await app.broker.get(run)
    return info is not None and info.state not in FINAL_JOB_STATES


async def list_runs(
    app: Host,
    *,
    status: str | None = None,
    workflow: str | None = None,
    limit: int | None = 100,
) -> list[Record]:
    """Runs kept in the store, newest first (their inputs and results too)."""
    now = time.time()
    out = []
    for raw in (await app.broker.kv_scan(RUN)).values():
        rec = dict(store.loads(raw))
        rec["status"] = store.public_status(rec, now)
        if status is not None and rec["status"] != status:
            continue
        if workflow is not None and workflow not in (rec.get("workflow"), _short(rec)):
            continue
        out.append(rec)
    out.sort(key=lambda r: float(r.get("created_at") or 0.0), reverse=True)
    return out if limit is None else out[:limit]


def _short(rec: Record) -> str:
    return str(rec.get("workflow", "")).rsplit(".", 1)[-1]


async def describe(app: Host, run: str) -> dict[str, Any]:
    """The run record plus its timeline: every recorded operation in order
    (name, kind, outcome, times, attempts, output or error), compensations,
    steps being retried and what the run waits for."""
    rec = await store.load(app.broker, run)
    if rec is None:
        info = await app.broker.get(run)
        if info is None:
            raise WorkflowNotFound(f"no workflow run {run} is stored (never started, or pruned)")
        return {
            "id": run,
            "workflow": info.message.name.removeprefix(TASK_PREFIX),
            "status": PENDING_STATE,
            "args": info.message.args,
            "kwargs": info.message.kwargs,
            "steps": [],
        }
    out = dict(rec)
    out["status"] = store.public_status(rec)
    steps: list[dict[str, Any]] = []
    prefix = f"{CHECKPOINT}{run}:"
    undo: list[dict[str, Any]] = []
    for key, raw in sorted((await app.broker.kv_scan(prefix)).items()):
        ck = dict(store.loads(raw))
        where = key[len(prefix) :]
        (undo if where.startswith("c") else steps).append(_timeline_entry(where, ck))
    # compensations in the order they ran (the reverse of their steps')
    steps += sorted(undo, key=lambda e: float(e.get("started_at") or 0.0))
    tries = await app.broker.kv_scan(f"{TRIES}{run}:")
    for key, raw in sorted(tries.items()):
        t = dict(store.loads(raw))
        where = key[len(f"{TRIES}{run}:") :]
        steps.append(
            {
                "pos": where,
                "name": t.get("n"),
                "kind": "retrying",
                "status": "retrying",
                "attempts": t.get("a"),
                "next_attempt_at": t.get("next"),
                "errors": t.get("errors"),
            }
        )
    out["steps"] = steps
    return out


def _timeline_entry(where: str, ck: dict[str, Any]) -> dict[str, Any]:
    t0, t1 = ck.get("t0"), ck.get("t1")
    status = "failed" if "e" in ck else "timed out" if ck.get("timeout") else "done"
    wake = ck.get("v")
    if ck.get("k") == "sleep" and isinstance(wake, int | float) and wake > time.time():
        status = "sleeping"
    entry: dict[str, Any] = {
        "pos": where,
        "name": ck.get("n"),
        "kind": ck.get("k"),
        "status": status,
        "started_at": t0,
        "finished_at": t1,
        "duration": (t1 - t0)
        if isinstance(t0, int | float) and isinstance(t1, int | float)
        else None,
        "attempts": ck.get("a"),
    }
    if "e" in ck:
        entry["error"] = ck["e"]
    elif ck.get("k") == "sleep":
        entry["until"] = ck.get("v")
    else:
        entry["output"] = ck.get("v")
    if ck.get("run"):
        entry["child"] = ck["run"]
    return entry


async def cancel(app: Host, run: str) -> bool:
    """Cancel a run that has not ended: no further step starts (a step running
    now finishes), its pending job is cancelled, a parent waiting for it
    sees it fail.  No compensation runs.  True if this call cancelled it."""
    broker = app.broker
    rec = await store.load(broker, run)
    if rec is None:
        info = await broker.get(run)
        if info is None:
            raise WorkflowNotFound(f"no workflow run {run} is stored (never started, or pruned)")
        now = time.time()
        stub = {
            "id": run,
            "workflow": info.message.name.removeprefix(TASK_PREFIX),
            "status": CANCELLED,
            "job": None,
            "args": info.message.args,
            "kwargs": info.message.kwargs,
            "queue": info.message.queue,
            "epoch": 0,
            "created_at": info.message.created_at,
            "updated_at": now,
            "finished_at": now,
        }
        if await broker.kv_add(store.run_key(run), store.dumps(stub), ttl=store.DEFAULT_RETENTION):
            await broker.cancel([run])
            _event(app, stub, CANCELLED)
            return True
    before: dict[str, Any] = {}

    def change(r: Record) -> Record | None:
        if r.get("status") in FINAL:
            return None
        before.update(job=r.get("job"), waiting=r.get("waiting"), parked_at=r.get("parked_at"))
        r.update(
            status=CANCELLED,
            job=None,
            finished_at=time.time(),
            parked_at=None,
            wake_at=None,
            waiting=None,
        )
        return r

    ttl = float(rec.get("retention") or store.DEFAULT_RETENTION) if rec else store.DEFAULT_RETENTION
    changed, new = await store.update(broker, run, change, ttl=ttl)
    if not changed or new is None:
        return False
    if before.get("job"):
        await broker.cancel([str(before["job"])])
    waiting = before.get("waiting") or {}
    if waiting.get("kind") == "event" and before.get("parked_at") is not None:
        await events.unregister(
            app,
            str(waiting["event"]),
            dict(waiting.get("match") or {}),
            run,
            int(before["parked_at"]),
        )
    await _keep(app, run, ttl)
    _event(app, new, CANCELLED)
    await notify_parent(app, new)
    return True


async def retry_run(app: Host, run: str) -> None:
    """Resume a failed run from the step that failed: that step's failure is
    forgotten (its attempts start again), the steps before it keep their
    checkpoints, and a new job replays the run.

    Also takes a run that is stuck because its current job died (dead-lettered
    after a worker was lost on its every attempt).  Refused for a run whose
    compensations ran: its effects were undone, so start a new run."""
    broker = app.broker
    rec = await store.load(broker, run)
    if rec is None:
        raise WorkflowNotFound(f"no workflow run {run} is stored (never started, or pruned)")
    state = rec.get("status")
    if state == FAILED:
        if rec.get("compensated"):
            raise WorkflowStateError(
                f"run {run} failed and its compensations ran (its steps were undone); "
                "start a new run instead of retrying it"
            )
    elif state in FINAL:
        raise WorkflowStateError(f"run {run} is {state}; only a failed run can be retried")
    else:
        job = rec.get("job")
        info = None if job is None else await broker.get(str(job))
        if job is None or (info is not None and info.state is not State.DEAD):
            raise WorkflowStateError(
                f"run {run} is {store.public_status(rec)} and its job is alive; "
                "only a failed run (or one whose job died) can be retried"
            )
    seen_job, epoch = rec.get("job"), int(rec.get("epoch") or 0) + 1
    failed_at = rec.get("failed_at")
    if isinstance(failed_at, int):
        await broker.kv_delete([store.ck_key(run, failed_at), store.try_key(run, failed_at)])
    if state == FAILED:
        await _keep(app, run, None)
    job_id = store.retry_job_id(run, epoch)

    def change(r: Record) -> Record | None:
        if r.get("status") != state or r.get("job") != seen_job:
            return None  # someone else moved it meanwhile
        history = list(r.get("errors") or [])
        if r.get("error"):
            history.append(r["error"])
        r.update(
            status=RUNNING,
            job=job_id,
            epoch=epoch,
            errors=history[-10:],
            error=None,
            failed_at=None,
            finished_at=None,
            parked_at=None,
            wake_at=None,
            waiting=None,
        )
        return r

    changed, new = await store.update(broker, run, change)
    if not changed or new is None:
        raise WorkflowStateError(f"run {run} changed while it was being retried; look again")
    await send(app, [resume_message(new, job_id)])
    _event(app, new, "retried")


async def signal(app: Host, run: str, payload: dict[str, Any], step: str | None = None) -> None:
    """Resolve the event wait ``run`` is parked at with ``payload``."""
    rec = await store.load(app.broker, run)
    if rec is None:
        raise WorkflowNotFound(f"no workflow run {run} is stored (never started, or pruned)")
    waiting = rec.get("waiting") or {}
    pos = rec.get("parked_at")
    if waiting.get("kind") != "event" or not isinstance(pos, int):
        raise WorkflowStateError(
            f"run {run} is {store.public_status(rec)} and waits for no event; a signal "
            "resolves a ctx.wait_for_event the run is parked at"
        )
    if step is not None and waiting.get("name") != step:
        raise WorkflowStateError(f"run {run} waits at {waiting.get('name')!r}, not at {step!r}")
    if not isinstance(payload, dict):
        raise WorkflowStateError(f"a signal's payload is a JSON object, got {payload!r}")
    check_json(payload, "the signal's payload")
    event_type = str(waiting.get("event"))
    _validate(event_type, payload)
    name = str(waiting.get("name"))
    if not await events.resolve(app, run, pos, name, payload, f"signal:{uuid7()}"):
        raise WorkflowStateError(f"the wait {name!r} of run {run} ended before the signal came")
    await events.unregister(app, event_type, dict(waiting.get("match") or {}), run, pos)


def _validate(event_type: str, payload: dict[str, Any]) -> None:
    """Check ``payload`` against the newest class of ``event_type`` this
    process knows (none known: the run validates it when it wakes)."""
    from ..event import REGISTRY

    versions = [v for (t, v) in REGISTRY if t == event_type]
    if not versions:
        return
    cls = REGISTRY[(event_type, max(versions))]
    try:
        cls.model_validate(payload)
    except Exception as exc:
        raise WorkflowStateError(f"the payload is not a valid {event_type}: {exc}") from None


async def _keep(app: Host, run: str, ttl: float | None) -> None:
    """Give every checkpoint of ``run`` this ttl (None: keep until the run ends)."""
    found = await app.broker.kv_scan(f"{CHECKPOINT}{run}:")
    if found:
        await app.broker.kv_set(found, ttl=ttl)
    if ttl is not None:
        stale = [
            *await app.broker.kv_scan(f"{TRIES}{run}:"),
            *await app.broker.kv_scan(f"{PENDING}{run}:"),
        ]
        if stale:
            await app.broker.kv_delete(stale)


def _event(app: Host, rec: Record, what: str) -> None:
    mw = app.middleware
    if mw.has("on_workflow_run"):
        mw.call("on_workflow_run", str(rec.get("workflow")), str(rec.get("id")), what)


__all__ = ["RUN", "cancel", "describe", "list_runs", "retry_run", "signal", "status"]
