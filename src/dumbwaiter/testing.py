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

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .app import App
from .brokers import from_url
from .drain import EAGER_TIMEOUT as EAGER_TIMEOUT
from .drain import drain as drain
from .drain import drain_sync as drain_sync
from .drain import eager_run as eager_run
from .drain import eager_running as eager_running
from .message import TASK, Message
from .middleware import Middleware
from .task import Task
from .worker import Worker

if TYPE_CHECKING:
    from .event import Event

E = TypeVar("E", bound="Event")

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
    app.middleware = app.middleware.plus(recorder)
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
