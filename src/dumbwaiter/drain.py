"""Running an app's worker until its queues drain: ``testing.drain`` for
tests, and eager mode (``App(eager=True)``), where each send runs what it
sent before it returns.  Below ``app.py`` (the App runs eager sends through
it), so it knows the app only as ``worker.WorkerApp``."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .brokers.types import JobFilter, QueueStats
from .message import TASK, Message
from .state import State
from .worker import Worker, WorkerApp, WorkerConfig

#: how long one eager enqueue may take to run what it started (seconds)
EAGER_TIMEOUT = 30.0

#: set inside an eager run: what the jobs it runs send is left to that run
_eager: contextvars.ContextVar[bool] = contextvars.ContextVar("dumbwaiter_eager", default=False)


async def drain(
    app: WorkerApp,
    queues: Sequence[str] | None = None,
    *,
    scheduled: bool = True,
    timeout: float = 30.0,
    **config: Any,
) -> Worker:
    """Run a worker on ``queues`` (default: every queue of the app's tasks and
    groups) until nothing is ready or running there (and,
    with ``scheduled``, nothing is waiting for its eta or retry either).

    Raises ``TimeoutError`` if that does not happen within ``timeout`` s.
    """
    return await _drain(app, queues, scheduled, timeout, None, config)


def drain_sync(
    app: WorkerApp,
    queues: Sequence[str] | None = None,
    *,
    scheduled: bool = True,
    timeout: float = 30.0,
    **config: Any,
) -> Worker:
    """``drain`` for sync tests: the worker runs on the app's own background
    loop (the one its sync calls use), so this works in any thread, also
    under a running event loop."""
    return app._call(drain(app, queues, scheduled=scheduled, timeout=timeout, **config))


async def _drain(
    app: WorkerApp,
    queues: Sequence[str] | None,
    scheduled: bool,
    timeout: float,
    forwarded: set[tuple[str, int]] | None,
    config: dict[str, Any],
) -> Worker:
    """``drain``; with ``forwarded`` (eager mode), jobs waiting for an eta or
    a retry are made due at once, each attempt once (the set remembers them),
    so a job a rate limit gives back still waits for its permit."""
    config.setdefault("concurrency", 8)
    config.setdefault("fetch_wait", 0.1)
    worker = Worker(app, WorkerConfig(queues=tuple(queues or ()), **config))
    queues = worker.queues
    run = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    pause = 0.001  # short at first: an eager run of one job is over in a few ms
    try:
        while True:
            if run.done():
                await run  # the worker crashed: raise its error
                raise RuntimeError("worker stopped before the queues drained")
            waiting = await _waiting(app, queues, scheduled)
            if worker.inflight == 0 and not waiting:
                break
            later = [s.queue for s in waiting if s.scheduled or s.retrying]
            if forwarded is not None and later:
                await _bring_forward(app, later, forwarded)
            if time.monotonic() > deadline:
                raise TimeoutError(await _not_drained(app, queues, timeout, worker, waiting))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)
    finally:
        worker.stop()
        await run
    return worker


async def _waiting(app: WorkerApp, queues: Sequence[str], scheduled: bool) -> list[QueueStats]:
    """The queues of ``queues`` that still hold work (ready, running and, with
    ``scheduled``, waiting for an eta or a retry)."""
    return [
        s
        for s in await app.broker.stats()
        if s.queue in queues
        and (s.ready or s.running or (scheduled and (s.scheduled or s.retrying)))
    ]


#: how many unfinished jobs a drain's timeout names
_NAMED = 10


async def _not_drained(
    app: WorkerApp,
    queues: Sequence[str],
    timeout: float,
    worker: Worker,
    waiting: list[QueueStats],
) -> str:
    """What a timed-out drain says: the counts of each queue still holding
    work and the first unfinished jobs (name, id, state, attempt, worker),
    so a test that failed on a stuck job shows which one and where."""
    counts = "; ".join(
        f"{s.queue}: {s.ready} ready, {s.running} running, {s.scheduled} scheduled, "
        f"{s.retrying} retrying"
        for s in waiting
    )
    named: list[str] = []
    try:
        for s in waiting:
            for state in (State.READY, State.RUNNING, State.SCHEDULED, State.RETRYING):
                if len(named) >= _NAMED:
                    break
                wanted = JobFilter(queue=s.queue, state=state)
                page = await app.broker.list_jobs(wanted, None, _NAMED)
                named += [
                    f"{i.message.name} {i.message.id} {i.state} attempt {i.message.attempt}"
                    + (f" on {i.worker}" if i.worker else "")
                    for i in page.items
                ]
    except Exception as exc:  # the timeout is the error to raise, not a listing's
        named.append(f"(could not list them: {exc!r})")
    return (
        f"queues {list(queues)} did not drain in {timeout} s "
        f"(the worker has {worker.inflight} in flight; {counts or 'no queue counts work'})"
        + (f"; unfinished: {', '.join(named[:_NAMED])}" if named else "")
    )


async def _bring_forward(
    app: WorkerApp, queues: list[str], forwarded: set[tuple[str, int]]
) -> None:
    now = time.time()
    for queue in queues:
        for state in (State.SCHEDULED, State.RETRYING):
            cursor = None
            while True:
                page = await app.broker.list_jobs(JobFilter(queue=queue, state=state), cursor, 500)
                due = []
                for info in page.items:
                    attempt = (info.message.id, info.message.attempt)
                    if attempt not in forwarded:
                        forwarded.add(attempt)
                        due.append(info.message.id)
                if due:
                    await app.broker.reschedule(due, now)
                if page.cursor is None:
                    break
                cursor = page.cursor


# -- eager mode ----------------------------------------------------------------


def eager_running() -> bool:
    """Whether this code runs inside an eager run (a job it runs, or the worker
    around it): then what it enqueues is run by that run, not by a new one."""
    return _eager.get()


async def eager_run(app: WorkerApp, sent: Iterable[Message]) -> None:
    """Run a worker until what ``sent`` started has finished: the jobs, the
    deliveries of the events to this app's groups, and everything those
    enqueue in turn, retries included and delays not waited for.  Called by
    the app after each send in eager mode."""
    queues = set(app.queues())
    for m in sent:
        if m.kind == TASK:
            queues.add(m.queue)
    token = _eager.set(True)  # copied into the worker's tasks and threads
    try:
        await _drain(app, sorted(queues), True, EAGER_TIMEOUT, set(), {})
    finally:
        _eager.reset(token)
