"""What a running job knows about itself.

A task receives a ``Context`` when it declares a parameter annotated with
``dw.Context``; any code running inside a job can also reach it with
``dw.Context.current()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from . import keys
from .errors import JobCancelled
from .inbox import mark, mark_sync
from .message import Message, check_json, dumps, loads
from .sqldb import adapt

T = TypeVar("T")
#: checkpoints are kept this long (seconds): 7 days
CHECKPOINT_TTL = 7 * 86400.0

if TYPE_CHECKING:
    from .ports import Runtime

_job_log = logging.getLogger("dumbwaiter.job")
_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "dumbwaiter_context", default=None
)


@dataclass(slots=True)
class Context:
    """One attempt of one job, as seen from inside the handler."""

    message: Message
    app: Runtime
    worker_id: str
    #: the task's timeout, as a ``time.monotonic()`` deadline (None: no timeout)
    deadline: float | None = None
    #: when the worker started this attempt (epoch seconds; for a rate-limited
    #: task, the time its permit is stamped with)
    started_at: float = 0.0
    #: free-form state middleware can share between its hooks for this attempt
    state: dict[str, Any] = field(default_factory=dict)
    #: the worker's event loop (sync handlers reach the broker through it)
    loop: asyncio.AbstractEventLoop | None = None
    #: set by the worker when a user asks to cancel this job (``dumbwaiter.cancel``)
    _cancel: bool = field(default=False, init=False, repr=False)

    @property
    def logger(self) -> logging.Logger:
        return _job_log

    @property
    def job_id(self) -> str:
        return self.message.id

    @property
    def name(self) -> str:
        return self.message.name

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def attempt(self) -> int:
        """This attempt's number, starting at 1."""
        return self.message.attempt

    @property
    def max_attempts(self) -> int:
        return self.message.max_attempts

    @property
    def is_last_attempt(self) -> bool:
        return self.message.attempt >= self.message.max_attempts

    @property
    def headers(self) -> dict[str, Any]:
        return self.message.headers

    # -- cooperative cancellation (see ``dumbwaiter.cancel``) --------------------

    @property
    def cancelled(self) -> bool:
        """True once someone asked to cancel this job while it runs (the
        dashboard, ``dumbwaiter jobs cancel``); the worker sees the request
        at its next heartbeat.  Check it between steps and stop where it is
        safe: nothing interrupts the handler."""
        return self._cancel

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelled`` if the job was asked to stop: the job then
        ends ``cancelled`` (not retried, not dead-lettered)."""
        if self._cancel:
            raise JobCancelled(f"job {self.message.id} ({self.name}) was cancelled while it ran")

    def _request_cancel(self) -> None:
        self._cancel = True

    @property
    def event_id(self) -> str:
        """The event's id for an event delivery (the same in every group), else
        the job's id."""
        return str(self.message.headers.get("event_id") or self.message.id)

    @property
    def correlation_id(self) -> str | None:
        value = self.message.headers.get("correlation_id")
        return None if value is None else str(value)

    @property
    def causation_id(self) -> str | None:
        value = self.message.headers.get("causation_id")
        return None if value is None else str(value)

    # -- the inbox: exactly-once effects in the handler's own database ----------

    @property
    def consumer(self) -> str:
        """Who consumes this message, for the inbox: the group's queue for an
        event, the task's name for a job."""
        return self.message.queue if self.message.kind == "event" else self.message.name

    def inbox(self, conn: Any) -> bool:
        """Mark this message handled in ``conn``'s transaction; False if it was
        (see ``dumbwaiter.inbox``).  sqlite3, psycopg or SQLAlchemy, sync."""
        return mark_sync(adapt(conn), self.consumer, self.event_id)

    async def ainbox(self, conn: Any) -> bool:
        """``inbox`` for async connections (psycopg or SQLAlchemy)."""
        return await mark(adapt(conn), self.consumer, self.event_id)

    # -- checkpoints (batch shards and other long jobs) -------------------------

    @property
    def _checkpoint_key(self) -> str:
        return keys.checkpoint(self.message.id)

    async def acheckpoint(self, state: Any) -> None:
        """Save ``state`` (JSON): a retry of this job can continue from it."""
        check_json(state, f"the checkpoint of {self.name}")
        await self.app.broker.kv_set({self._checkpoint_key: dumps(state)}, ttl=CHECKPOINT_TTL)
        self.state["checkpointed"] = True

    async def aload_checkpoint(self) -> Any:
        """The state the last attempt saved, or None."""
        raw = (await self.app.broker.kv_get([self._checkpoint_key])).get(self._checkpoint_key)
        return None if raw is None else loads(raw)

    def checkpoint(self, state: Any) -> None:
        """``acheckpoint`` for sync handlers (they run in the worker's threads)."""
        self._from_thread(self.acheckpoint(state))

    def load_checkpoint(self) -> Any:
        """``aload_checkpoint`` for sync handlers."""
        return self._from_thread(self.aload_checkpoint())

    def _from_thread(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            coro.close()
            raise RuntimeError(
                "checkpoint()/load_checkpoint() are for sync handlers; in an async "
                "handler, await ctx.acheckpoint() / ctx.aload_checkpoint()"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    @classmethod
    def current(cls) -> Context | None:
        """The context of the job running in this task or thread, if any."""
        return _current.get()


def context_param(fn: Callable[..., Any]) -> str | None:
    """The parameter of ``fn`` annotated ``dw.Context`` (it receives the context)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to their text
        hints = {}
    for p in inspect.signature(fn).parameters.values():
        ann = hints.get(p.name, p.annotation)
        if ann is Context or (isinstance(ann, str) and ann.split(".")[-1] == "Context"):
            return p.name
    return None


def caused_headers(headers: dict[str, Any] | None) -> dict[str, Any]:
    """Headers for a message sent now: inside a running job, the new message
    inherits its ``correlation_id`` and names it as its ``causation_id``, so a
    chain of jobs and events can be followed end to end."""
    out = dict(headers) if headers else {}
    ctx = _current.get()
    if ctx is not None:
        cause = ctx.event_id
        out.setdefault("correlation_id", ctx.headers.get("correlation_id") or cause)
        out.setdefault("causation_id", cause)
    return out


#: the running job's context or None (``Context.current`` without the method call)
current_context = _current.get


def set_current(ctx: Context | None) -> contextvars.Token[Context | None]:
    return _current.set(ctx)


def reset_current(token: contextvars.Token[Context | None]) -> None:
    _current.reset(token)
