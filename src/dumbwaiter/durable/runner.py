"""One segment of a run: the handler of the hidden task ``dw.wf:NAME``.

It opens the run (creating its record on the first segment), replays the
workflow function with a fresh ``ctx``, and ends in one of four ways:

* the function returned: the run succeeded (record, result, checkpoints
  kept for the retention, the parent told);
* it parked: the next segment is enqueued (at the wake time, if any) and
  the record handed to it; this job succeeds, no worker waits;
* it raised: the completed steps' compensations run, last first, then the
  run failed and this job is dead-lettered with the reason (``dw.Reject``),
  where alerts and the DLQ see it; ``dumbwaiter workflows retry`` (or a
  replay of the dead letter) resumes it from the failed step;
* it lost the run (cancelled, or another segment took over): it stops.

The record changes by ``kv_update`` only if this job still owns the run
(the record's ``job``), so a stale or duplicate segment changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..context import Context
from ..errors import SerializationError
from ..message import check_json, uuid7
from ..retry import Reject
from . import store
from .admin import retry_run
from .context import AsyncWorkflowContext, WorkflowContext
from .errors import StepFailed, WorkflowCodeChanged
from .jobs import notify_parent, resume_message, run_of, send, wake
from .replay import CHUNK, Fenced, Park, Replay
from .store import (
    FAILED,
    FINAL,
    PARENT_HEADER,
    RUNNING,
    SLEEPING,
    SUCCEEDED,
    WAITING,
    Record,
)

if TYPE_CHECKING:
    from .api import DurableWorkflow
    from .host import Host

log = logging.getLogger("dumbwaiter.durable")

#: a run started on a newer version than this worker's code waits this long
#: (seconds) for a worker with that version
VERSION_WAIT = 30.0

_STATUS_OF_PARK = {"sleep": SLEEPING, "version": SLEEPING, "event": WAITING, "child": WAITING}


async def run_segment(
    app: Host, wf: DurableWorkflow[Any, Any], ctx: Context, pool: Executor
) -> None:
    msg = ctx.message
    run, job = run_of(msg), msg.id
    opened = await _open(app, wf, run, job, ctx)
    if opened is None:
        return
    rec, found, virgin = opened
    loop = asyncio.get_running_loop()
    replay = Replay(app, wf, rec, job, virgin=virgin, pool=pool, loop=loop)
    if not virgin:
        replay.preload(found, CHUNK)
    try:
        value = await _call(wf, replay, rec, loop, pool)
    except asyncio.CancelledError:
        replay.stopped = True  # the job goes back; its thread must not go on
        raise
    except Park as park:
        await _suspend(app, replay, park)
        return
    except Fenced:
        log.debug("segment %s of run %s stopped: the run is no longer its own", job, run)
        return
    except WorkflowCodeChanged as exc:
        await _fail(app, replay, exc, compensate=False)
        return
    except Exception as exc:
        await _fail(app, replay, exc, compensate=True)
        return
    await _complete(app, replay, value)


async def _open(
    app: Host, wf: DurableWorkflow[Any, Any], run: str, job: str, ctx: Context
) -> tuple[Record, dict[str, bytes], bool] | None:
    """The run's record (and the first checkpoints, read with it), or None when
    this segment has nothing to do."""
    broker = app.broker
    msg = ctx.message
    if job == run:  # the first segment: it carries the inputs
        parent = msg.headers.get(PARENT_HEADER)
        rec = store.new_record(
            run,
            wf.name,
            wf.version,
            list(msg.args),
            dict(msg.kwargs),
            job,
            msg.queue,
            parent if isinstance(parent, dict) else None,
        )
        rec["priority"] = msg.priority
        rec["retention"] = wf.retention
        if await broker.kv_add(store.run_key(run), store.dumps(rec)):
            _event(app, wf.name, run, "started")
            return rec, {}, True
    keys = [store.run_key(run), *(store.ck_key(run, p) for p in range(CHUNK))]
    found = await broker.kv_get(keys)
    raw = found.get(keys[0])
    if raw is None:
        log.warning(
            "run %s of %s has no record (pruned?); its job %s does nothing", run, wf.name, job
        )
        return None
    rec = dict(store.loads(raw))
    if rec.get("job") != job:
        return None  # stale: a wake-up, a retry or a cancel moved the run on
    status = rec.get("status")
    if status in FINAL:
        await notify_parent(app, rec)  # a crash may have come between the two
        if status == FAILED:
            if msg.attempt == 1 and msg.errors:  # replayed from the dead-letter queue
                await retry_run(app, run)
                return None
            raise Reject(_failure_text(rec))
        return None
    version = int(rec.get("version") or 1)
    if version > wf.version:
        await _sleep_for_its_version(app, rec, job, "version", time.time() + VERSION_WAIT, version)
        return None
    return rec, found, False


async def _call(
    wf: DurableWorkflow[Any, Any],
    replay: Replay,
    rec: Record,
    loop: asyncio.AbstractEventLoop,
    pool: Executor,
) -> Any:
    args, kwargs = list(rec.get("args") or []), dict(rec.get("kwargs") or {})
    if wf.is_async:
        return await wf.fn(AsyncWorkflowContext(replay), *args, **kwargs)
    wctx = WorkflowContext(replay, loop)
    cv = contextvars.copy_context()
    return await loop.run_in_executor(pool, cv.run, wf.fn, wctx, *args, **kwargs)


async def _suspend(app: Host, replay: Replay, park: Park) -> None:
    """End the segment where the workflow waits (``park``): store where the run
    waits and its status, and enqueue its wake-up job for a timed wait."""
    run, job = replay.run, replay.job
    nxt = uuid7() if park.until is not None else None
    if nxt is not None:
        await send(app, [resume_message(replay.rec, nxt, eta=park.until)])
    waiting = {"kind": park.kind, "name": park.name, **park.detail}
    status = _STATUS_OF_PARK.get(park.kind, RUNNING)

    def change(rec: Record) -> Record | None:
        if rec.get("job") != job or rec.get("status") in FINAL:
            return None
        rec.update(job=nxt, status=status, parked_at=park.pos, wake_at=park.until, waiting=waiting)
        return rec

    changed, _ = await store.update(app.broker, run, change)
    if changed and park.kind in ("event", "child"):
        # the event (or the child's end) may have come before the record said
        # where the run waits: then its wake-up found nothing to wake
        key = store.ck_key(run, park.pos)
        if key in await app.broker.kv_get([key]):
            await wake(app, run, park.pos)


async def _sleep_for_its_version(
    app: Host, rec: Record, job: str, kind: str, until: float, version: int
) -> None:
    """Put the run to sleep until ``until``: this worker runs another version
    of the workflow's code, and a worker with ``version`` may take it then."""
    nxt = uuid7()
    await send(app, [resume_message(rec, nxt, eta=until)])
    waiting = {"kind": kind, "name": f"a worker with version {version}"}

    def change(r: Record) -> Record | None:
        if r.get("job") != job or r.get("status") in FINAL:
            return None
        r.update(job=nxt, status=SLEEPING, wake_at=until, waiting=waiting)
        return r

    await store.update(app.broker, str(rec["id"]), change)


async def _complete(app: Host, replay: Replay, value: Any) -> None:
    try:
        check_json(value, f"the result of workflow {replay.wf.name}")
    except SerializationError as exc:
        await _fail(app, replay, exc, compensate=True)
        return
    job = replay.job

    def change(rec: Record) -> Record | None:
        if rec.get("job") != job or rec.get("status") in FINAL:
            return None
        rec.update(
            status=SUCCEEDED,
            result=value,
            finished_at=time.time(),
            parked_at=None,
            wake_at=None,
            waiting=None,
        )
        return rec

    changed, rec = await store.update(app.broker, replay.run, change, ttl=replay.wf.retention)
    if not changed or rec is None:
        return
    await _expire(app, replay)
    _event(app, replay.wf.name, replay.run, SUCCEEDED)
    await notify_parent(app, rec)


async def _fail(app: Host, replay: Replay, exc: BaseException, *, compensate: bool) -> None:
    comp_errors: list[dict[str, Any]] = []
    if compensate:
        try:
            comp_errors = await replay.compensate()
        except Park as park:
            await _suspend(app, replay, park)
            return
        except Fenced:
            return
    step = replay.failed[1] if replay.failed else None
    err = store.error_record(exc, step)
    if isinstance(exc, StepFailed):  # the step's own error says why, not the wrapper
        err.update(type=exc.type, message=exc.message, step=exc.step)
    if comp_errors:
        err["compensation_errors"] = comp_errors
    job = replay.job

    def change(rec: Record) -> Record | None:
        if rec.get("job") != job or rec.get("status") in FINAL:
            return None
        rec.update(
            status=FAILED,
            error=err,
            failed_at=replay.failed[0] if replay.failed else None,
            compensated=bool(compensate and replay.compensations),
            finished_at=time.time(),
            parked_at=None,
            wake_at=None,
            waiting=None,
        )
        return rec

    changed, rec = await store.update(app.broker, replay.run, change, ttl=replay.wf.retention)
    if not changed or rec is None:
        return
    await _expire(app, replay)
    _event(app, replay.wf.name, replay.run, FAILED)
    await notify_parent(app, rec)
    raise Reject(_failure_text(rec)) from exc


def _failure_text(rec: Record) -> str:
    err = rec.get("error") or {}
    where = f" at step {err['step']!r}" if err.get("step") else ""
    text = f"workflow {rec.get('workflow')} run {rec.get('id')} failed{where}: "
    text += f"{err.get('type', '?')}: {err.get('message', '')}"
    if err.get("compensation_errors"):
        text += f" ({len(err['compensation_errors'])} compensation(s) failed too)"
    return text


async def _expire(app: Host, replay: Replay) -> None:
    """Keep the finished run's checkpoints as long as its record; drop the
    bookkeeping of retries and waits."""
    items = {store.ck_key(replay.run, p): store.dumps(ck) for p, ck in replay.cache.items()}
    items.update({k: store.dumps(ck) for k, ck in replay.comp_cache.items()})
    if items:
        await app.broker.kv_set(items, ttl=replay.wf.retention)
    if replay.cleanup:
        await app.broker.kv_delete(sorted(replay.cleanup))


def _event(app: Host, workflow: str, run: str, status: str) -> None:
    mw = app.middleware
    if mw.has("on_workflow_run"):
        mw.call("on_workflow_run", workflow, run, status)
