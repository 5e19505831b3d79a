"""``@app.workflow``: registering a durable workflow, starting runs, their handles.

``@app.workflow`` (bare, or with ``name=``, ``queue=``, ``version=``,
``retry=``, ``step_timeout=``, ``priority=``, ``retention=``) turns a
function whose first parameter is the workflow context into a
``DurableWorkflow``.  ``signup.enqueue(user_id)`` (``aenqueue`` for async
callers) checks the arguments against the function's signature, like a
task's ``enqueue``, stores the run's first job and returns a
``WorkflowRun``: ``status()``, ``result(timeout=)``, ``cancel()``,
``signal(payload)``, ``retry()``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
)

from ..errors import ConfigurationError, ResultTimeout
from ..message import Message
from ..retry import Retry
from ..task import SendOptions, Task
from ..typevars import P, R, T
from . import admin, store
from .errors import WorkflowCancelled, WorkflowFailed, WorkflowNotFound
from .store import CANCELLED, FAILED, FINAL, SUCCEEDED

if TYPE_CHECKING:
    from .host import Host

_P = ParamSpec("_P")
_R = TypeVar("_R")


class DurableWorkflow(Generic[P, R]):
    """A registered durable workflow: ``signup.enqueue(user_id)`` starts a run.

    ``DurableWorkflow[P, R]`` has the function's parameters after ``ctx``
    (``P``) and its return type (``R``; for an async function, its
    coroutine), so a type checker checks ``enqueue``'s arguments and knows
    what ``run.result()`` returns."""

    #: the hidden task whose jobs are this workflow's run segments (set by
    #: ``registry.register``, which knows the runner)
    task: Task[..., Any]

    def __init__(
        self,
        app: Host,
        fn: Callable[..., R],
        *,
        name: str,
        queue: str,
        version: int,
        retry: Retry,
        step_timeout: float | None,
        priority: int,
        retention: float,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.version = version
        self.retry = retry
        self.step_timeout = step_timeout
        self.priority = priority
        self.retention = retention
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = _without_ctx(fn, name)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<DurableWorkflow {self.name} v{self.version} queue={self.queue}>"

    def start_message(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        run_id: str | None = None,
        opts: SendOptions | None = None,
    ) -> Message:
        """The first job of a run: checks the arguments, carries the inputs;
        its id is the run's id."""
        msg = self.task.message(args, kwargs, opts or SendOptions())
        if run_id is not None:
            msg.id = run_id
        msg.headers.setdefault("correlation_id", msg.id)
        return msg

    def options(
        self,
        *,
        key: str | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> BoundWorkflow[P, R]:
        """``signup.options(key="signup:42").enqueue(42)``: ``key`` makes the
        start idempotent (one run per workflow and key: a second start
        returns the first run); ``delay``, ``priority``, ``queue`` as for
        tasks."""
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigurationError(f"key must be a non-empty string, got {key!r}")
        return BoundWorkflow(
            self, key, SendOptions.make(delay=delay, priority=priority, queue=queue)
        )

    @overload
    def enqueue(
        self: DurableWorkflow[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    @overload
    def enqueue(
        self: DurableWorkflow[P, _R], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    def enqueue(self, *args: Any, **kwargs: Any) -> WorkflowRun[Any]:
        """Start a run (sync callers); returns its handle."""
        job = self.task._enqueue_one(self.start_message(args, kwargs))
        return WorkflowRun(self.app, job.id)

    @overload
    async def aenqueue(
        self: DurableWorkflow[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    @overload
    async def aenqueue(
        self: DurableWorkflow[P, _R], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    async def aenqueue(self, *args: Any, **kwargs: Any) -> WorkflowRun[Any]:
        """``enqueue`` for async callers."""
        job = await self.task._aenqueue_one(self.start_message(args, kwargs))
        return WorkflowRun(self.app, job.id)

    def run(self, id: str) -> WorkflowRun[Any]:
        """The handle of a run started elsewhere."""
        return WorkflowRun(self.app, id)


class BoundWorkflow(Generic[P, R]):
    """A workflow with per-start options (``workflow.options(...)``)."""

    def __init__(self, wf: DurableWorkflow[P, R], key: str | None, opts: SendOptions) -> None:
        self.wf = wf
        self.key = key
        self.opts = opts

    def _message(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Message:
        run_id = None if self.key is None else store.keyed_run_id(self.wf.name, self.key)
        return self.wf.start_message(args, kwargs, run_id=run_id, opts=self.opts)

    @overload
    def enqueue(
        self: BoundWorkflow[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    @overload
    def enqueue(
        self: BoundWorkflow[P, _R], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    def enqueue(self, *args: Any, **kwargs: Any) -> WorkflowRun[Any]:
        job = self.wf.task._enqueue_one(self._message(args, kwargs))
        return WorkflowRun(self.wf.app, job.id)

    @overload
    async def aenqueue(
        self: BoundWorkflow[P, Coroutine[Any, Any, _R]], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    @overload
    async def aenqueue(
        self: BoundWorkflow[P, _R], *args: P.args, **kwargs: P.kwargs
    ) -> WorkflowRun[_R]: ...
    async def aenqueue(self, *args: Any, **kwargs: Any) -> WorkflowRun[Any]:
        job = await self.wf.task._aenqueue_one(self._message(args, kwargs))
        return WorkflowRun(self.wf.app, job.id)


class WorkflowRun(Generic[T]):
    """The handle of a run: only its id and the app, cheap to make anywhere
    (``app.workflow_run(id)`` or ``workflow.run(id)``)."""

    __slots__ = ("app", "id")

    def __init__(self, app: Host, id: str) -> None:
        self.app = app
        self.id = id

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowRun) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    # -- async -----------------------------------------------------------------

    async def ainfo(self) -> dict[str, Any]:
        """The run as stored (record, steps, what it waits for); see ``admin.describe``."""
        return await admin.describe(self.app, self.id)

    async def astatus(self) -> str:
        """``pending``, ``running``, ``sleeping``, ``waiting``, ``succeeded``,
        ``failed`` or ``cancelled``; ``WorkflowNotFound`` if unknown."""
        return await admin.status(self.app, self.id)

    async def aresult(self, timeout: float | None = None) -> T:
        """Wait up to ``timeout`` s (None: for ever) for the run to end; its
        return value, or ``WorkflowFailed`` / ``WorkflowCancelled``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            rec = await store.load(self.app.broker, self.id)
            if rec is not None and rec.get("status") in FINAL:
                return cast(T, _outcome(rec))
            if rec is None and not await admin.first_job_pending(self.app, self.id):
                raise WorkflowNotFound(f"no workflow run {self.id} is stored")
            if deadline is not None and time.monotonic() >= deadline:
                state = "pending" if rec is None else store.public_status(rec)
                raise ResultTimeout(f"workflow run {self.id} is still {state} after {timeout} s")
            wait = pause if deadline is None else min(pause, deadline - time.monotonic())
            await asyncio.sleep(max(wait, 0))
            pause = min(pause * 2, 0.2)

    async def acancel(self) -> bool:
        return await admin.cancel(self.app, self.id)

    async def aretry(self) -> None:
        await admin.retry_run(self.app, self.id)

    async def asignal(self, payload: dict[str, Any], step: str | None = None) -> None:
        await admin.signal(self.app, self.id, payload, step)

    # -- sync ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return self.app._call(self.ainfo())

    def status(self) -> str:
        return self.app._call(self.astatus())

    def result(self, timeout: float | None = None) -> T:
        return self.app._call(self.aresult(timeout))

    def cancel(self) -> bool:
        """Cancel the run unless it ended; True if it was cancelled.  A step
        already running finishes; no later step starts; no compensation runs."""
        return self.app._call(self.acancel())

    def retry(self) -> None:
        """Resume a failed run from the step that failed (see ``admin.retry_run``)."""
        self.app._call(self.aretry())

    def signal(self, payload: dict[str, Any], step: str | None = None) -> None:
        """Resolve the event wait the run is parked at with ``payload``, as if
        a matching event had been published."""
        self.app._call(self.asignal(payload, step))


def _outcome(rec: store.Record) -> Any:
    status = rec.get("status")
    if status == SUCCEEDED:
        return rec.get("result")
    if status == CANCELLED:
        raise WorkflowCancelled(f"workflow run {rec.get('id')} was cancelled")
    assert status == FAILED
    err = rec.get("error") or {}
    where = f" at step {err['step']!r}" if err.get("step") else ""
    raise WorkflowFailed(
        f"workflow run {rec.get('id')} ({rec.get('workflow')}) failed{where}: "
        f"{err.get('type', '?')}: {err.get('message', '')}",
        workflow_id=str(rec.get("id") or ""),
        step=str(err.get("step") or ""),
        task=str(rec.get("workflow") or ""),
        job_id=str(rec.get("job") or ""),
        error_type=err.get("type"),
        error=err.get("message"),
    )


class WorkflowDecorator(Protocol):
    """What ``@app.workflow(...)`` with options returns."""

    def __call__(self, fn: Callable[Concatenate[Any, _P], _R], /) -> DurableWorkflow[_P, _R]: ...


_registry: weakref.WeakKeyDictionary[Host, dict[str, DurableWorkflow[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)


def workflows(app: Host) -> dict[str, DurableWorkflow[Any, Any]]:
    """The durable workflows registered on ``app``, by name."""
    found = _registry.get(app)
    if found is None:
        found = _registry[app] = {}
    return found


def _without_ctx(fn: Callable[..., Any], name: str) -> inspect.Signature:
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"workflow {name}: its function must take the workflow context first: "
            "def signup(ctx: dw.WorkflowContext, user_id: int) -> ..."
        )
    return sig.replace(parameters=params[1:])
