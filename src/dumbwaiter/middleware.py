"""Middleware: the extension point for metrics, tracing, logging and policy.

A middleware is a class whose hook methods default to no-ops; override the
ones you need.  The first middleware in the list is the outermost:
``before_*`` hooks run in list order, ``after_*`` hooks in reverse.  A hook
that raises is logged and counted, never allowed to lose a message; only
``RetryLater`` and ``Reject`` raised by ``before_process`` or
``around_process`` change a job's outcome, exactly as if the task had raised
them.

Three lifecycle hooks are awaited, so a middleware may talk to the broker
in them: ``after_success`` (before the job's ack: an error there fails the
attempt), ``on_dead`` and ``on_cancelled`` (when the worker decides, before
the outcome is stored), each written ``def`` or ``async def``.  The app's
workflows and batches are middleware of this kind (``lifecycle``),
registered by the App after the user's own: the worker knows nothing of
them.

Retries, leases and the dead-letter queue are core, not middleware: turning
a middleware off can never make jobs disappear.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .message import ErrorRecord, Message
from .retry import JobControl

if TYPE_CHECKING:
    from .context import Context
    from .worker import Worker

log = logging.getLogger("dumbwaiter.middleware")

CallNext = Callable[[], Awaitable[Any]]


class Middleware:
    """Base class; every hook is a no-op."""

    #: extra keyword options this middleware lets ``@app.task`` accept
    task_options: ClassVar[frozenset[str]] = frozenset()
    #: when set, this middleware's job lifecycle hooks (``after_success``,
    #: ``on_dead``, ``on_cancelled``) run only for jobs whose message carries
    #: this header: the app's workflow and batch middleware say so, and a
    #: plain job's attempt then calls neither (``MiddlewareStack.runs``)
    only_with_header: ClassVar[str | None] = None

    def before_enqueue(self, message: Message) -> None:
        """A message is about to be sent (headers may still be changed)."""

    def after_enqueue(self, message: Message, id: str) -> None:
        """A message was stored under ``id`` (the existing id for a duplicate key)."""

    def before_process(self, ctx: Context) -> None:
        """An attempt is about to run."""

    async def around_process(self, ctx: Context, call_next: CallNext) -> Any:
        """Wrap an attempt (spans, contextvars); must return ``await call_next()``."""
        return await call_next()

    def after_process(self, ctx: Context, result: Any, exc: BaseException | None) -> None:
        """An attempt finished, with its result or the exception it raised."""

    def on_retry(self, ctx: Context, error: ErrorRecord, at: float) -> None:
        """A failed attempt will be tried again at ``at`` (epoch seconds)."""

    def after_success(self, ctx: Context) -> Awaitable[None] | None:
        """An attempt succeeded (its result is ``ctx.state["result"]``); run
        (awaited, for an ``async def``) before the job is acked, innermost
        middleware first.  An exception here fails the attempt (retried by
        the task's policy), and a crash before the ack runs the job and this
        hook again: make it idempotent.  The app's workflows enqueue their
        next step here."""
        return None

    def on_dead(self, ctx: Context | None, error: ErrorRecord) -> Awaitable[None] | None:
        """A job went to the dead-letter queue (``ctx`` is None if its body did not decode).

        Also called by a worker's rescuer for a job whose worker died on its
        last attempt (a ``LeaseExpired`` error): then ``ctx`` is built by the
        rescuing worker around the job's stored message (task name, args,
        kwargs, headers, attempt, every error ending with that one).

        Called when the worker decides, before the dead letter is written;
        an ``async def on_dead`` is awaited there (the app's workflows and
        batches record their dead steps and shards so).
        """
        return None

    def on_cancelled(self, ctx: Context) -> Awaitable[None] | None:
        """A job was stopped on request (``dumbwaiter.cancel``): one that ran
        and ended on ``ctx.cancelled``, or one fetched and not started; run
        (awaited, for an ``async def``) before the cancellation is stored.
        ``ctx.message`` is the job's."""
        return None

    def on_rescued(self, worker: Worker, count: int) -> None:
        """``worker``'s rescuer gave ``count`` expired jobs (of lost workers) back."""

    def on_workflow_run(self, workflow: str, run_id: str, status: str) -> None:
        """A durable workflow run ``started``, ``succeeded``, ``failed``, was
        ``cancelled`` or ``retried`` (in the process where that happened)."""

    def on_workflow_step(self, workflow: str, step: str, seconds: float, ok: bool) -> None:
        """An attempt of a durable workflow's step (or compensation) ended."""

    def on_worker_start(self, worker: Worker) -> None:
        """A worker started (before its first fetch)."""

    def on_worker_stop(self, worker: Worker) -> None:
        """A worker stopped (after its last ack)."""


#: the hooks ``Middleware.only_with_header`` narrows
_LIFECYCLE = ("after_success", "on_dead", "on_cancelled")

_HOOKS = (
    "before_enqueue",
    "after_enqueue",
    "before_process",
    "around_process",
    "after_process",
    "on_retry",
    "on_dead",
    "after_success",
    "on_cancelled",
    "on_rescued",
    "on_workflow_run",
    "on_workflow_step",
    "on_worker_start",
    "on_worker_stop",
)


class MiddlewareStack:
    """The app's middleware list, with each hook's overriders found once, so
    the hot path skips hooks nobody uses.

    ``middleware`` is the user's list; ``builtin`` the app's own (workflows,
    batches), innermost: after every user middleware.  ``plus`` makes the
    stack with more user middleware, the built-in ones still last."""

    def __init__(
        self, middleware: Sequence[Middleware], builtin: Sequence[Middleware] = ()
    ) -> None:
        self.middleware = list(middleware)
        self.builtin = tuple(builtin)
        self.errors = 0
        every = [*self.middleware, *self.builtin]
        self._by_hook: dict[str, list[Middleware]] = {
            hook: [m for m in every if getattr(type(m), hook) is not getattr(Middleware, hook)]
            for hook in _HOOKS
        }
        #: each hook's overriders in calling order (``after_*`` reversed), worked
        #: out once: ``call`` runs on every enqueue and every attempt
        self._ordered: dict[str, list[Middleware]] = {
            hook: ms[::-1] if hook.startswith("after_") or hook == "on_worker_stop" else ms
            for hook, ms in self._by_hook.items()
        }
        #: whether any middleware has an enqueue hook: without one, a single
        #: enqueue skips the hook plumbing altogether (``Task.enqueue``)
        self.enqueue_hooks = bool(self._by_hook["before_enqueue"] or self._by_hook["after_enqueue"])
        #: the hooks some middleware overrides; the worker tests it on every
        #: attempt (``"before_process" in stack.used``), where ``has`` is a call
        self.used = frozenset(hook for hook, ms in self._by_hook.items() if ms)
        #: per lifecycle hook: whether a middleware runs it for every job, and
        #: the headers that narrow the others (``runs``)
        self._always = {
            h: any(m.only_with_header is None for m in self._by_hook[h]) for h in _LIFECYCLE
        }
        self._headers = {
            h: frozenset(m.only_with_header for m in self._by_hook[h] if m.only_with_header)
            for h in _LIFECYCLE
        }

    def plus(self, *middleware: Middleware) -> MiddlewareStack:
        return MiddlewareStack([*self.middleware, *middleware], self.builtin)

    def has(self, hook: str) -> bool:
        return hook in self.used

    def runs(self, hook: str, message: Message | None) -> bool:
        """Whether a lifecycle ``hook`` has a middleware to run for a job of
        ``message`` (None: its body did not decode): one that takes every job,
        or one whose ``only_with_header`` the message carries."""
        if self._always[hook]:
            return True
        return message is not None and not self._headers[hook].isdisjoint(message.headers)

    def call(self, hook: str, *args: Any) -> None:
        """Run a plain hook on every middleware that overrides it (after_* reversed)."""
        for m in self._ordered[hook]:
            try:
                getattr(m, hook)(*args)
            except Exception as exc:
                self._failed(m, hook, exc)

    async def acall(self, hook: str, ctx: Context | None, *args: Any) -> None:
        """``call`` for a lifecycle hook that may be written ``async def``
        (``on_dead``, ``on_cancelled``): awaited where it is; a middleware
        with ``only_with_header`` only for a job that carries the header."""
        message = ctx.message if ctx is not None else None
        for m in self._ordered[hook]:
            if not _applies(m, message):
                continue
            try:
                done = getattr(m, hook)(ctx, *args)
                if done is not None and inspect.isawaitable(done):
                    await done
            except Exception as exc:
                self._failed(m, hook, exc)

    def _failed(self, m: Middleware, hook: str, exc: Exception) -> None:
        if isinstance(exc, JobControl):
            if hook == "before_process":
                raise exc  # RetryLater / Reject from before_process decide the outcome
            self.errors += 1
            log.warning(
                "middleware %s.%s raised a job control exception, ignored",
                type(m).__name__,
                hook,
            )
            return
        self.errors += 1
        log.error("middleware %s.%s failed", type(m).__name__, hook, exc_info=exc)

    async def after_success(self, ctx: Context) -> None:
        """Await every ``after_success`` (of those ``only_with_header`` lets
        run), innermost first; an exception fails the attempt."""
        for m in self._ordered["after_success"]:
            if not _applies(m, ctx.message):
                continue
            done = m.after_success(ctx)
            if done is not None:  # an async def's coroutine
                await done

    async def around(self, ctx: Context, innermost: CallNext) -> Any:
        """Run ``innermost`` wrapped by every ``around_process`` (first = outermost)."""
        call = innermost
        for m in reversed(self._by_hook["around_process"]):
            call = _wrap(m, ctx, call)
        return await call()


def _applies(m: Middleware, message: Message | None) -> bool:
    """Whether ``m``'s lifecycle hooks run for a job of ``message``."""
    header = m.only_with_header
    return header is None or (message is not None and header in message.headers)


def _wrap(m: Middleware, ctx: Context, call_next: CallNext) -> CallNext:
    async def call() -> Any:
        return await m.around_process(ctx, call_next)

    return call
