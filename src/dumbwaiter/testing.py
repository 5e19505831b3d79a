"""Helpers for testing code that uses dumbwaiter (and for dumbwaiter's own tests).

* ``await drain(app)`` / ``drain_sync(app)`` run a real worker until the
  queues are empty and return it (its ``counts`` say what happened), so a
  test waits on the queues draining instead of sleeping.
* ``isolate(app)`` points an app, the user's own with its tasks, at a fresh
  ``memory://`` broker for the length of a test and records what it sends:
  the ``Harness`` it yields answers "what was enqueued, what was published".
* Eager mode (``App(eager=True)``, ``harness.eager = True``) runs each job
  inside the call that enqueued it, through the same JSON checks and decoding
  a worker of a server broker applies, with the task's retry policy.

The pytest plugin (``dumbwaiter.pytest_plugin``) wraps these in fixtures;
docs/testing.md shows both.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .app import App
from .brokers import from_url
from .brokers.base import JobFilter, QueueStats
from .message import TASK, Message
from .middleware import Chain, Middleware
from .state import State
from .task import Task
from .worker import Worker, WorkerConfig

if TYPE_CHECKING:
    from .event import Event

E = TypeVar("E", bound="Event")

#: how long one eager enqueue may take to run what it started (seconds)
EAGER_TIMEOUT = 30.0

#: set inside an eager run: what the jobs it runs send is left to that run
_eager: contextvars.ContextVar[bool] = contextvars.ContextVar("dumbwaiter_eager", default=False)


async def drain(
    app: App,
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
    app: App,
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
    app: App,
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
                raise TimeoutError(f"queues {list(queues)} did not drain in {timeout} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)
    finally:
        worker.stop()
        await run
    return worker


async def _waiting(app: App, queues: Sequence[str], scheduled: bool) -> list[QueueStats]:
    """The queues of ``queues`` that still hold work (ready, running and, with
    ``scheduled``, waiting for an eta or a retry)."""
    return [
        s
        for s in await app.broker.stats()
        if s.queue in queues
        and (s.ready or s.running or (scheduled and (s.scheduled or s.retrying)))
    ]


async def _bring_forward(app: App, queues: list[str], forwarded: set[tuple[str, int]]) -> None:
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


async def eager_run(app: App, sent: Iterable[Message]) -> None:
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


# -- recording and isolation ---------------------------------------------------


class Recorder(Middleware):
    """Keeps a copy of every job and event an app sends, in order (an
    ``after_enqueue`` hook, so it sees the messages as they were stored)."""

    def __init__(self) -> None:
        self.jobs: list[Message] = []
        self.events: list[Message] = []

    def after_enqueue(self, message: Message, id: str) -> None:
        (self.jobs if message.kind == TASK else self.events).append(message.copy())

    def clear(self) -> None:
        self.jobs.clear()
        self.events.clear()


class Harness:
    """One test's view of an app: what it enqueued and published, a drain, and
    the eager switch.  Made by ``isolate`` (and the ``dw_testing`` fixture)."""

    def __init__(self, app: App, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder

    @property
    def eager(self) -> bool:
        """Run each job inside the call that enqueued it (``App.eager``)."""
        return self.app.eager

    @eager.setter
    def eager(self, on: bool) -> None:
        self.app.eager = on

    def enqueued(self, task: Task | str | None = None) -> list[Message]:
        """The jobs enqueued since the start (or ``clear()``), oldest first;
        only those of ``task`` (a task, its name, or the last part of its
        name: ``"send_welcome"``) if given.  Each is the stored ``Message``:
        ``.args``, ``.kwargs``, ``.queue``, ``.eta``, ``.priority``, ``.key``,
        ``.headers``, and ``.id`` for ``app.job(id)``."""
        jobs = list(self.recorder.jobs)
        if task is None:
            return jobs
        return [m for m in jobs if _named(m.name, task)]

    @overload
    def published(self, event: type[E]) -> list[E]: ...
    @overload
    def published(self, event: str | None = None) -> list[Message]: ...
    def published(self, event: type[Event] | str | None = None) -> list[Any]:
        """The events published since the start (or ``clear()``), oldest first.

        With an event class, the events of its type as instances of it (older
        versions upgraded by the app's upcasters), ready to compare with
        ``==``; with a type name (``"order.created"``) or nothing, the
        envelopes (``.payload``, ``.key``, ``.headers``)."""
        events = list(self.recorder.events)
        if event is None:
            return events
        if isinstance(event, str):
            return [m for m in events if m.name == event]
        out = []
        for m in events:
            if m.name != event.event_type:
                continue
            version = int(m.headers.get("schema_version", 1))
            payload = dict(m.payload or {})
            if version < event.event_version:
                payload = self.app.upgrade(m.name, version, event.event_version, payload)
            out.append(event.model_validate(payload))
        return out

    def clear(self) -> None:
        """Forget what was recorded so far (the jobs stay in the broker)."""
        self.recorder.clear()

    def drain(self, queues: Sequence[str] | None = None, **kw: Any) -> Worker:
        """Run the app's jobs until its queues are empty (``drain_sync``)."""
        return drain_sync(self.app, queues, **kw)

    async def adrain(self, queues: Sequence[str] | None = None, **kw: Any) -> Worker:
        """``drain`` for async tests (``testing.drain``)."""
        return await drain(self.app, queues, **kw)


@contextmanager
def isolate(app: App, *, eager: bool | None = None) -> Iterator[Harness]:
    """Run ``app``, tasks and subscriptions as they are, on a fresh private
    ``memory://`` broker inside the block, recording what it sends; put back
    its broker, middleware and eager setting after.

    Nothing connects to the app's own broker, and no job of one test is seen
    by the next.  The app keeps its message size limit (the smaller of its
    own and its real broker's), so a job too big for production is too big
    here.  ``eager`` sets the eager mode for the block (default: as it is).
    """
    saved = (app.url, app.broker, app.middleware, app.eager, app._declared)
    broker = from_url("memory://")
    broker.max_message_size = app.max_message_size
    broker.event_retention = app.event_retention
    recorder = Recorder()
    app.url, app.broker, app._declared = "memory://", broker, False
    app.middleware = Chain([*app.middleware.middleware, recorder])
    if eager is not None:
        app.eager = eager
    try:
        yield Harness(app, recorder)
    finally:
        app.url, app.broker, app.middleware, app.eager, app._declared = saved


def _named(name: str, task: Task | str) -> bool:
    if isinstance(task, Task):
        return name == task.name
    return name == task or name.endswith("." + task)
