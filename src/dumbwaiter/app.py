"""``App``: the registry of tasks, the configuration and the broker.

An App is plain data plus the producer API.  Creating one checks the broker
URL (an unknown scheme or a missing extra fails here, with the fix in the
message) but opens no connection and starts no thread: that happens on the
first enqueue or when a worker starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import timedelta, tzinfo
from functools import cached_property
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast, overload

from .batch import Batch
from .batch import start as start_batch
from .blocking import warn_if_loop_running
from .brokers import DEFAULT_URL, deadline, from_url
from .brokers.base import DEFAULT_EVENT_RETENTION, Broker
from .brokers.capacity import WhenFull, check_bound, wait_for_room
from .brokers.types import Binding
from .drain import eager_run, eager_running
from .errors import ConfigurationError, InvalidArguments
from .flow import OPTIONS as FLOW_OPTIONS
from .flow import Flow
from .job import Job
from .lifecycle import BatchShards, WorkflowSteps
from .message import DEFAULT_MAX_MESSAGE_SIZE, TASK, Message, decode, encode
from .middleware import Middleware, MiddlewareStack
from .portal import Portal
from .redact import mask_url
from .registration import default_name, qualname, seconds
from .retry import Retry
from .schedule import declare
from .task import DEFAULT_RESULT_TTL, Task, TaskDecorator
from .workflow import Signature

if TYPE_CHECKING:
    from .context import Context
    from .durable.api import DurableWorkflow, WorkflowDecorator
    from .event import Event, Subscription, Upcaster
    from .outbox import Outbox
    from .schedule import Policy, Schedule
    from .webhooks.service import Webhooks

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
#: ``@app.task``: the function's parameters and return type
_P = ParamSpec("_P")
_R = TypeVar("_R")

#: environment variable read when ``App()`` gets no URL
URL_ENV = "DUMBWAITER_URL"
#: seconds a producer call (enqueue, publish) waits for an unreachable
#: broker before it raises ``BrokerUnavailable``: an API must answer quickly
DEFAULT_ENQUEUE_TIMEOUT = 5.0

_TASK_KEYWORDS = frozenset(
    {"name", "queue", "retry", "timeout", "priority", "keep_result", "max_ready", "when_full"}
)
#: longest ``aclose`` waits for the sync bridge's connections to close (s)
_SETTLE_TIMEOUT = 5.0


class App:
    """``dw.App("sqlite:///jobs.db")``; with no URL, ``$DUMBWAITER_URL`` or
    ``sqlite:///dumbwaiter.db``.

    ``eager=True`` is for unit tests: each enqueue or publish returns only
    after a worker ran what it sent (docs/testing.md)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        default_queue: str = "default",
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
        max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE,
        middleware: Sequence[Middleware] = (),
        event_retention: float | timedelta = DEFAULT_EVENT_RETENTION,
        eager: bool = False,
        enqueue_timeout: float | timedelta | None = DEFAULT_ENQUEUE_TIMEOUT,
        max_ready: Mapping[str, int] | None = None,
        when_full: WhenFull = "raise",
    ) -> None:
        self.url = url or os.environ.get(URL_ENV) or DEFAULT_URL
        self.broker: Broker = from_url(self.url)
        self.default_queue = default_queue
        self.retry = retry if retry is not None else Retry()
        self.timeout = seconds(timeout)
        #: the producer's deadline: seconds an ``enqueue``/``publish`` may take
        #: while the broker is unreachable before it raises ``BrokerUnavailable``
        #: (None: the broker's own ``reconnect`` window, as workers have);
        #: per call with ``task.options(enqueue_timeout=)`` / ``publish(enqueue_timeout=)``
        self.enqueue_timeout = seconds(enqueue_timeout)
        limit = self.broker.capabilities.max_message_size
        if max_message_size is not None and limit is not None:
            max_message_size = min(max_message_size, limit)
        self.max_message_size = max_message_size
        self.broker.max_message_size = max_message_size
        #: bounded queues (docs/flow-control.md): queue -> the most jobs it may
        #: hold waiting; an enqueue past it raises ``QueueFull`` (or, with
        #: ``when_full="wait"`` for that queue, waits for room until its deadline)
        self.max_ready: dict[str, int] = {}
        self.when_full: dict[str, WhenFull] = {}
        for queue, limit in (max_ready or {}).items():
            self.bound(queue, limit, when_full)
        #: the user's middleware, then the app's own: workflows and batches
        #: move on through lifecycle hooks (the worker knows nothing of them)
        self.middleware = MiddlewareStack(middleware, (BatchShards(), WorkflowSteps()))
        self.tasks: dict[str, Task] = {}
        #: (group queue, event type) -> its handler
        self.subscriptions: dict[tuple[str, str], Subscription] = {}
        #: (event type, from version) -> function upgrading a payload one version
        self.upcasters: dict[tuple[str, int], Upcaster] = {}
        #: queue -> the handler of any event delivered there (the durable
        #: workflows' router, which wakes runs waiting for events)
        self.event_routes: dict[str, Task] = {}
        #: task name -> what runs one of its messages, where that depends on the
        #: message (a webhook delivery runs under its endpoint's limits)
        self.task_resolvers: dict[str, Callable[[Message], Task]] = {}
        #: seconds events stay in the log (replay) and consumers' inbox marks
        self.event_retention = seconds(event_retention) or DEFAULT_EVENT_RETENTION
        self.broker.event_retention = self.event_retention
        self._declared = False
        self._portal = Portal()
        #: run every job (and event delivery) at once, inside the call that sent
        #: it, for unit tests: see ``dumbwaiter.testing`` and docs/testing.md
        self.eager = eager

    def __repr__(self) -> str:
        return f"<dumbwaiter.App {mask_url(self.url)} tasks={len(self.tasks)}>"

    # -- registry ------------------------------------------------------------

    # ``@app.task`` keeps the function's types (``Task[P, R]``; a function
    # taking a ``dw.Context`` gives ``Task[..., R]``, see ``TaskDecorator``);
    # ``@app.task(...)`` takes only the options below, so a misspelt one is a
    # type error as well as the ``ConfigurationError`` it always was.

    @overload
    def task(self, fn: Callable[Concatenate[Context, ...], _R], /) -> Task[..., _R]: ...
    @overload
    def task(self, fn: Callable[[Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def task(self, fn: Callable[[Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def task(self, fn: Callable[[Any, Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def task(self, fn: Callable[[Any, Any, Any, Any, Context], _R], /) -> Task[..., _R]: ...
    @overload
    def task(self, fn: Callable[_P, _R], /) -> Task[_P, _R]: ...
    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        retry: Retry | bool | None = None,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        keep_result: bool | float | timedelta | None = False,
        rate_limit: str | tuple[int, float] | None = None,
        concurrency: int | None = None,
        limit_key: Callable[[Mapping[str, Any]], Any] | None = None,
        unique: bool | float | timedelta | None = None,
        debounce: float | timedelta | None = None,
        max_ready: int | None = None,
        when_full: WhenFull | None = None,
    ) -> TaskDecorator: ...

    def task(
        self, fn: Callable[..., Any] | None = None, /, **options: Any
    ) -> Task[..., Any] | TaskDecorator:
        """Register a function (sync or async) as a task.

        ``@app.task`` or ``@app.task(queue=, retry=, timeout=, priority=,
        keep_result=, name=)`` and the flow-control options (``rate_limit=``,
        ``concurrency=``, ``limit_key=``, ``unique=``, ``debounce=``, and the
        bound of the task's queue, ``max_ready=`` with ``when_full=``, see
        docs/flow-control.md).  A middleware may accept more options
        (``Middleware.task_options``); a type checker does not know them, so
        pass them from a ``dict[str, Any]``: ``@app.task(**options)``.
        """
        known = _TASK_KEYWORDS.union(
            FLOW_OPTIONS, *(m.task_options for m in self.middleware.middleware)
        )
        unknown = set(options) - known
        if unknown:
            raise ConfigurationError(
                f"unknown task option(s) {sorted(unknown)}; known: {sorted(known)} "
                "(is a middleware that accepts them missing from App(middleware=...)?)"
            )

        def register(f: Callable[..., Any]) -> Task[..., Any]:
            return self._register(f, options)

        return register(fn) if fn is not None else cast(TaskDecorator, register)

    def _register(self, fn: Callable[..., Any], options: dict[str, Any]) -> Task[..., Any]:
        if not callable(fn):
            raise ConfigurationError(f"@app.task needs a function, got {fn!r}")
        opts = dict(options)
        name = opts.pop("name", None) or default_name(fn)
        queue = opts.pop("queue", None) or self.default_queue
        retry = self._retry(opts.pop("retry", None), f"task {name}")
        timeout = seconds(opts.pop("timeout", None)) or self.timeout
        priority = opts.pop("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ConfigurationError(f"task {name}: priority must be an integer")
        max_ready = opts.pop("max_ready", None)
        when_full = opts.pop("when_full", None)
        if max_ready is not None:
            self.bound(queue, max_ready, when_full or "raise")
        elif when_full is not None:
            raise ConfigurationError(f"task {name}: when_full= needs max_ready=")
        keep = opts.pop("keep_result", False)
        keep_result: float | None
        if keep is True:
            keep_result = DEFAULT_RESULT_TTL
        elif keep is False or keep is None:
            keep_result = None
        else:
            keep_result = seconds(keep)
        flow = Flow.from_options(name, opts)
        if (
            flow is not None
            and not self.broker.capabilities.limits
            and (flow.limited or flow.debounce or flow.unique == "active")
        ):
            raise ConfigurationError(
                f"task {name}: the {type(self.broker).__name__} broker has no flow control "
                "yet (capabilities.limits); rate_limit, concurrency, unique=True and debounce "
                "need it"
            )
        existing = self.tasks.get(name)
        if existing is not None and existing.fn is not fn and qualname(existing.fn) != qualname(fn):
            raise ConfigurationError(
                f"two tasks are named {name!r} ({qualname(existing.fn)} and {qualname(fn)}); "
                "give one of them name="
            )
        task = Task(
            self,
            fn,
            name=name,
            queue=queue,
            retry=retry,
            timeout=timeout,
            priority=priority,
            keep_result=keep_result,
            options=opts,
            flow=flow,
        )
        self.tasks[name] = task
        return task

    # ``@app.workflow``: a durable workflow (dumbwaiter.durable, see
    # docs/durable-workflows.md), typed with the parameters after its ``ctx``.

    @overload
    def workflow(self, fn: Callable[Concatenate[Any, _P], _R], /) -> DurableWorkflow[_P, _R]: ...
    @overload
    def workflow(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        version: int = 1,
        retry: Retry | bool | None = None,
        step_timeout: float | timedelta | None = None,
        priority: int = 0,
        retention: float | timedelta | None = None,
    ) -> WorkflowDecorator: ...

    def workflow(
        self, fn: Callable[..., Any] | None = None, /, **options: Any
    ) -> DurableWorkflow[..., Any] | WorkflowDecorator:
        """Register a durable workflow: a function (sync or async) whose first
        parameter is the workflow context (``ctx.step``, ``ctx.sleep``,
        ``ctx.wait_for_event``...); ``flow.enqueue(...)`` starts a run."""
        from .durable.registry import register

        def deco(f: Callable[..., Any]) -> DurableWorkflow[..., Any]:
            return register(self, f, options)

        return deco(fn) if fn is not None else cast("WorkflowDecorator", deco)

    def use(self, *middleware: Middleware) -> None:
        """Add middleware after the app was built (the outermost stays first):
        the CLI adds metrics and tracing this way."""
        self.middleware = self.middleware.plus(*middleware)

    def job(self, id: str) -> Job:
        """A handle for a job enqueued elsewhere."""
        return Job(self, id)

    def outbox(self, conn: Any) -> Outbox:
        """Send jobs and events inside the transaction ``conn`` is in (sqlite3,
        psycopg, SQLAlchemy; sync or async): ``app.outbox(conn).enqueue(task,
        ...)`` / ``.publish(event)`` (``aenqueue`` / ``apublish`` for async
        connections).  Nothing is sent if the transaction rolls back."""
        from .outbox import Outbox

        return Outbox(self, conn)

    def subscribe(
        self,
        event: type[Event],
        *,
        group: str,
        retry: Retry | bool | None = None,
        timeout: float | timedelta | None = None,
    ) -> Callable[[F], Subscription]:
        """Register a handler of ``event`` in subscriber ``group``:
        ``@app.subscribe(OrderCreated, group="email")``.

        Every group gets every event; workers inside a group share them.  The
        handler takes the event (the newest version of ``event``, older
        payloads upgraded) and optionally a ``dw.Context``."""

        def register(fn: F) -> Subscription:
            from .event import Subscription

            sub = Subscription(
                self,
                event,
                group,
                fn,
                retry=self._retry(retry, f"subscription {group}"),
                timeout=seconds(timeout) or self.timeout,
            )
            key = (sub.queue, event.event_type)
            existing = self.subscriptions.get(key)
            if existing is not None and qualname(existing.fn) != qualname(fn):
                raise ConfigurationError(
                    f"group {group!r} already handles {event.event_type} with "
                    f"{qualname(existing.fn)}; one handler per event type and group"
                )
            self.subscriptions[key] = sub
            return sub

        return register

    def upcast(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register a function that upgrades a payload of ``event_type`` from
        ``from_version`` to ``from_version + 1`` (a dict in, a dict out)."""

        def register(fn: Upcaster) -> Upcaster:
            self.upcasters[(event_type, from_version)] = fn
            return fn

        return register

    def upgrade(
        self, event_type: str, version: int, target: int, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """Run the upcasters from ``version`` up to ``target``."""
        while version < target:
            fn = self.upcasters.get((event_type, version))
            if fn is None:
                raise InvalidArguments(
                    f"event {event_type} version {version} cannot be upgraded to {target}: "
                    f'no @app.upcast("{event_type}", from_version={version})'
                )
            try:
                payload = fn(dict(payload))
            except Exception as exc:
                raise InvalidArguments(
                    f"upcaster of {event_type} from version {version} failed: {exc!r}"
                ) from exc
            version += 1
        return payload

    def batch(
        self,
        task: Task,
        items: Iterable[Any],
        *,
        chunk_size: int = 100,
        on_complete: Signature | None = None,
        on_failure: Signature | None = None,
        batch_id: str | None = None,
        name: str | None = None,
    ) -> Batch:
        """Shard ``items`` into jobs of ``task`` (``task(items)`` per chunk, or
        ``task(start, stop)`` for a ``range``), tracked as one batch; pass
        ``batch_id`` to resume one.  See ``dumbwaiter.batch``."""
        return self._call(
            self.abatch(
                task,
                items,
                chunk_size=chunk_size,
                on_complete=on_complete,
                on_failure=on_failure,
                batch_id=batch_id,
                name=name,
            )
        )

    async def abatch(
        self,
        task: Task,
        items: Iterable[Any],
        *,
        chunk_size: int = 100,
        on_complete: Signature | None = None,
        on_failure: Signature | None = None,
        batch_id: str | None = None,
        name: str | None = None,
    ) -> Batch:
        """``batch`` for async callers."""
        return await start_batch(
            self,
            task,
            items,
            chunk_size=chunk_size,
            on_complete=on_complete,
            on_failure=on_failure,
            batch_id=batch_id,
            name=name,
        )

    def bound(self, queue: str, max_ready: int, when_full: WhenFull = "raise") -> None:
        """Bound ``queue`` to ``max_ready`` waiting jobs (``App(max_ready=)``
        and ``@app.task(max_ready=)`` call this).  Two different bounds for
        one queue are a ``ConfigurationError``: the bound is the queue's, not
        a task's."""
        check_bound(queue, max_ready, when_full)
        known = self.max_ready.get(queue)
        if known is not None and (known, self.when_full[queue]) != (max_ready, when_full):
            raise ConfigurationError(
                f"queue {queue!r} is bounded twice: max_ready={known} "
                f"when_full={self.when_full[queue]!r}, then max_ready={max_ready} "
                f"when_full={when_full!r}; give it one bound (App(max_ready=) or one task)"
            )
        self.max_ready[queue] = max_ready
        self.when_full[queue] = when_full

    def queues(self) -> list[str]:
        """Every queue this app's code handles: its tasks' and its groups'."""
        found = {t.queue for t in self.tasks.values()} | {q for q, _ in self.subscriptions}
        found |= set(self.event_routes)
        return sorted(found) or [self.default_queue]

    def bindings(self) -> list[Binding]:
        """The event bindings of this app's subscriptions."""
        return [
            Binding(event_type, queue, sub.retry.attempts)
            for (queue, event_type), sub in sorted(self.subscriptions.items())
        ]

    def handler(self, msg: Message) -> Task | Subscription | None:
        """What runs ``msg``: its task, or its group's subscription."""
        if msg.kind == TASK:
            if self.task_resolvers:
                resolve = self.task_resolvers.get(msg.name)
                if resolve is not None:
                    return resolve(msg)
            return self.tasks.get(msg.name)
        return self.subscriptions.get((msg.queue, msg.name)) or self.event_routes.get(msg.queue)

    def _retry(self, retry: Retry | bool | None, what: str) -> Retry:
        if retry is None or retry is True:
            return self.retry
        if retry is False:
            return Retry.never()
        if not isinstance(retry, Retry):
            raise ConfigurationError(f"{what}: retry= takes a dw.Retry, got {retry!r}")
        return retry

    # -- publishing ------------------------------------------------------------

    def publish(
        self,
        event: Event,
        *,
        key: str | None = None,
        headers: dict[str, Any] | None = None,
        enqueue_timeout: float | timedelta | None = None,
    ) -> str:
        """Publish ``event`` to every subscriber group; return its id.

        The payload was validated when the event was built; it is checked for
        JSON and size here, before anything is sent.  ``key`` orders events
        of one entity where the broker promises order.  ``enqueue_timeout``
        overrides the App's for this call."""
        warn_if_loop_running(None, "publish", 2)
        msg = _event_message(event, key, headers)
        if self.eager:
            [msg] = _through_json([msg])
        hooks = self.middleware.enqueue_hooks
        if hooks:
            self._before([msg])
        token = deadline.start(self._deadline(enqueue_timeout))
        try:
            if not self._declared:
                self._call(self._declare())
            if self.broker.capabilities.sync_enqueue:
                self.broker.publish_sync([msg])
            else:
                self._call(self.broker.publish([msg]))
        finally:
            deadline.end(token)
        if hooks:
            self._sent([msg], [msg.id])
        if self.eager:
            self._run_eagerly_sync([msg])
        return msg.id

    async def apublish(
        self,
        event: Event,
        *,
        key: str | None = None,
        headers: dict[str, Any] | None = None,
        enqueue_timeout: float | timedelta | None = None,
    ) -> str:
        """``publish`` for async callers."""
        msg = _event_message(event, key, headers)
        if self.eager:
            [msg] = _through_json([msg])
        hooks = self.middleware.enqueue_hooks
        if hooks:
            self._before([msg])
        token = deadline.start(self._deadline(enqueue_timeout))
        try:
            if not self._declared:
                await self._declare()
            await self.broker.publish([msg])
        finally:
            deadline.end(token)
        if hooks:
            self._sent([msg], [msg.id])
        if self.eager:
            await self._run_eagerly([msg])
        return msg.id

    def _deadline(self, per_call: float | timedelta | None) -> float | None:
        """Seconds the producer call may wait for the broker: ``per_call``,
        else the App's ``enqueue_timeout``."""
        return self.enqueue_timeout if per_call is None else seconds(per_call)

    async def _declare(self) -> None:
        """Bind this app's groups before its first publish, so a monolith's own
        subscribers never miss an event published before a worker started."""
        if self.subscriptions:
            await self.broker.declare(sorted({b.queue for b in self.bindings()}), self.bindings())
        self._declared = True

    # -- producing -----------------------------------------------------------

    def _send_sync(self, msgs: Iterable[Message]) -> list[Job]:
        if self.eager:
            msgs = _through_json(msgs)
        msgs = self._before(msgs)
        if self.max_ready:
            msgs = list(msgs)
            ids = self._call(self._enqueue(msgs))
        elif self.broker.capabilities.sync_enqueue:
            ids = self.broker.enqueue_sync(msgs)
        else:
            msgs = list(msgs)
            ids = self._call(self.broker.enqueue(msgs))
        jobs = self._sent(msgs, ids)
        if self.eager:
            self._run_eagerly_sync(msgs)
        return jobs

    async def _send(self, msgs: Iterable[Message]) -> list[Job]:
        if self.eager:
            msgs = _through_json(msgs)
        msgs = self._before(msgs)
        if self.max_ready:
            msgs = list(msgs)
            ids = await self._enqueue(msgs)
        else:
            ids = await self.broker.enqueue(msgs)
        jobs = self._sent(msgs, ids)
        if self.eager:
            await self._run_eagerly(msgs)
        return jobs

    async def _enqueue(self, msgs: list[Message]) -> list[str]:
        """Enqueue where some queue may be bounded: through the broker's
        ``enqueue_bounded`` when one of ``msgs`` goes to a bounded queue,
        waiting for room if that queue's ``when_full`` says so."""
        bounded = {m.queue for m in msgs if m.queue in self.max_ready}
        if not bounded:
            return await self.broker.enqueue(msgs)

        def send() -> Awaitable[list[str]]:
            return self.broker.enqueue_bounded(msgs, self.max_ready)

        if any(self.when_full[q] == "wait" for q in bounded):
            return await wait_for_room(send)
        return await send()

    # -- eager mode (unit tests) -----------------------------------------------

    def _run_eagerly_sync(self, sent: Iterable[Message]) -> None:
        """Run what ``sent`` started, unless this is a job of a run under way
        (that run takes it: waiting for it here would wait for ourselves)."""
        if not eager_running():
            self._call(eager_run(self, sent))

    async def _run_eagerly(self, sent: Iterable[Message]) -> None:
        if not eager_running():
            await eager_run(self, sent)

    def _send_flow_sync(self, msgs: Iterable[Message]) -> list[Job]:
        return self._call(self._send_flow(list(msgs)))

    async def _send_flow(self, msgs: list[Message]) -> list[Job]:
        """Enqueue jobs of tasks with ``unique=<window>`` or ``debounce``.

        A unique window is a ``kv_add`` of the job's key with that TTL: a
        second job inside the window gets the first one's id.  A debounced job
        holds its key while it waits; an enqueue in the burst finds it and
        pushes it back by the debounce delay."""
        ids: list[str | None] = [None] * len(msgs)
        keep: list[int] = []
        for i, m in enumerate(msgs):
            window = m.headers.get("unique_window")
            if window is not None:
                key = str(m.headers["unique_key"])
                if not await self.broker.kv_add(key, m.id.encode(), ttl=float(window)):
                    held = (await self.broker.kv_get([key])).get(key)
                    if held is not None:
                        ids[i] = held.decode()
                        continue
            keep.append(i)
        jobs = await self._send([msgs[i] for i in keep])
        for i, job in zip(keep, jobs, strict=True):
            ids[i] = job.id
            delay = msgs[i].headers.get("debounce")
            if delay is not None and job.id != msgs[i].id:  # the burst's job: push it back
                await self.broker.reschedule([job.id], time.time() + float(delay))
        return [Job(self, i) for i in ids if i is not None]

    def _before(self, msgs: Iterable[Message]) -> Iterable[Message]:
        """Run ``before_enqueue``; without enqueue hooks, leave ``msgs`` lazy.

        A lazy batch lets the broker encode each message and drop it at once,
        so a large ``enqueue_many`` does not hold every envelope at once (and
        does not set off a full garbage collection of the caller's heap)."""
        mw = self.middleware
        if not (mw.has("before_enqueue") or mw.has("after_enqueue")):
            return msgs
        msgs = list(msgs)
        for m in msgs:
            mw.call("before_enqueue", m)
        return msgs

    def _sent(self, msgs: Iterable[Message], ids: list[str]) -> list[Job]:
        mw = self.middleware
        if mw.has("after_enqueue"):
            call = mw.call
            for m, i in zip(msgs, ids, strict=True):
                call("after_enqueue", m, i)
        return [Job(self, i) for i in ids]

    # -- sync bridge -----------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a broker coroutine from sync code (see portal.py)."""
        return self._portal.call(coro)

    def close(self) -> None:
        """Close connections opened by sync calls (the portal and sync producers)."""
        try:
            if "webhooks" in self.__dict__:
                self._portal.call(self.webhooks.aclose())
            self._portal.call(self.broker.close())
        finally:
            self._portal.close()

    async def aclose(self) -> None:
        """Close this loop's connections and those sync calls opened.

        The broker keeps one connection per loop: this one's is closed here,
        the sync bridge's is asked to close on its own loop, which is let
        finish (``_SETTLE_TIMEOUT`` at most) before it stops."""
        try:
            if "webhooks" in self.__dict__:
                await self.webhooks.aclose()
            await self.broker.close()
            await self._portal.settle(_SETTLE_TIMEOUT)
        finally:
            self._portal.close()

    @cached_property
    def webhooks(self) -> Webhooks:
        """Outgoing webhooks: endpoints, ``send``, fan-out of events
        (``dumbwaiter.webhooks``, docs/webhooks.md).  The first use registers
        the delivery task, so touch it where the app is defined."""
        from .webhooks.service import Webhooks

        return Webhooks(self)

    # -- schedules -------------------------------------------------------------

    @cached_property
    def schedules(self) -> dict[str, Schedule]:
        """Periodic schedules by name (``@app.periodic``); run by ``dumbwaiter
        scheduler`` or ``dumbwaiter worker --with-scheduler``."""
        return {}

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        tz: str | tzinfo | None = None,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: Policy = "skip",
        catch_up: int | None = None,
        grace: timedelta | float | None = None,
        **task_options: Any,
    ) -> TaskDecorator:
        """Run a task periodically, once per tick however many schedulers run.

        ``@app.periodic(cron="0 3 * * *", tz="Asia/Taipei")`` or
        ``@app.periodic(every=timedelta(minutes=5))`` on a new function
        registers it as a task too (``task_options`` go to ``@app.task``);
        ``app.periodic(cron=..., args=(...), kwargs={...}, name=...)(task)``
        schedules an existing task with arguments.  ``missed`` says what to do
        with ticks missed while no scheduler ran: ``skip`` (default), ``once``
        (one catch-up) or ``all`` (up to ``catch_up`` of them); ticks late by
        less than ``grace`` (60 s) are not missed.  An invalid expression, an
        unknown time zone or arguments that do not fit the task fail here.
        See docs/scheduler.md.
        """
        # declare's decorator returns the task it was given, or registers the
        # function with @app.task: either way, what TaskDecorator says
        return cast(
            TaskDecorator,
            declare(
                self,
                self.schedules,
                lambda fn: self.task(**task_options)(fn),
                cron=cron,
                every=every,
                tz=tz,
                name=name,
                args=args,
                kwargs=kwargs,
                missed=missed,
                catch_up=catch_up,
                grace=grace,
                task_options=task_options,
            ),
        )


def _event_message(event: Event, key: str | None, headers: dict[str, Any] | None) -> Message:
    """``event.event_message``, imported on the first publish (an app of tasks
    only never loads pydantic), then called straight, without a function-level
    import on every call."""
    global _event_message
    from .event import event_message

    _event_message = event_message
    return event_message(event, key, headers)


def _through_json(msgs: Iterable[Message]) -> list[Message]:
    """Messages as a worker decodes them from a server broker's JSON (tuples
    arrive as lists...): in eager mode a job gets no value production would
    not give it, whatever broker the test runs on."""
    return [decode(encode(m)) for m in msgs]
