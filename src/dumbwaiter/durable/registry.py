"""Registering a durable workflow (``@app.workflow``): its hidden segment
task, whose body is the runner, and the router that wakes runs waiting for
events.  Above ``api`` (the handles) and ``runner``, which know a workflow
only as the ``DurableWorkflow`` this builds.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..context import Context
from ..errors import ConfigurationError
from ..message import Message
from ..registration import default_name, qualname, seconds
from ..retry import Retry
from ..task import Task, _positional_shape
from . import store
from .api import DurableWorkflow, workflows
from .events import ROUTER_QUEUE, router_task
from .jobs import SEGMENT_RETRY, task_name
from .runner import run_segment

if TYPE_CHECKING:
    from .host import Host

#: the options ``@app.workflow(...)`` takes
OPTIONS = frozenset({"name", "queue", "version", "retry", "step_timeout", "priority", "retention"})
#: threads that run sync workflow functions and sync steps of async ones
POOL_SIZE = 64

_pools: weakref.WeakKeyDictionary[Host, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


def _pool(app: Host) -> ThreadPoolExecutor:
    pool = _pools.get(app)
    if pool is None:
        pool = _pools[app] = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="dumbwaiter-wf")
    return pool


class _SegmentTask(Task[..., Any]):
    """The hidden task ``dw.wf:NAME`` whose jobs are a run's segments.

    Its producer side checks a start's arguments against the *workflow*
    function's signature (without ``ctx``); its worker side takes no
    arguments from the message (only a run's first job carries the inputs,
    which the runner keeps in the run record)."""

    def __init__(self, app: Host, wf: DurableWorkflow[Any, Any]) -> None:
        async def segment(ctx: Context) -> None:
            await run_segment(app, wf, ctx, _pool(app))

        super().__init__(
            app,
            segment,
            name=task_name(wf.name),
            queue=wf.queue,
            retry=SEGMENT_RETRY,
            timeout=None,
            priority=wf.priority,
            keep_result=None,
            options={},
        )
        self.signature = wf.signature
        self._positional = _positional_shape(wf.signature)

    def bind(self, msg: Message) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {}


@dataclass(frozen=True, slots=True)
class _Options:
    name: str | None = None
    queue: str | None = None
    version: int = 1
    retry: Retry | bool | None = None
    step_timeout: float | timedelta | None = None
    priority: int = 0
    retention: float | timedelta | None = None


def register(
    app: Host, fn: Callable[..., Any], options: dict[str, Any]
) -> DurableWorkflow[Any, Any]:
    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown workflow option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}"
        )
    if not callable(fn):
        raise ConfigurationError(f"@app.workflow needs a function, got {fn!r}")
    o = _Options(**options)
    name = o.name or default_name(fn)
    if not isinstance(o.version, int) or isinstance(o.version, bool) or o.version < 1:
        raise ConfigurationError(
            f"workflow {name}: version must be an integer >= 1, got {o.version!r}"
        )
    if not isinstance(o.priority, int) or isinstance(o.priority, bool):
        raise ConfigurationError(f"workflow {name}: priority must be an integer")
    wf: DurableWorkflow[Any, Any] = DurableWorkflow(
        app,
        fn,
        name=name,
        queue=o.queue or app.default_queue,
        version=o.version,
        retry=app._retry(o.retry, f"workflow {name}"),
        step_timeout=seconds(o.step_timeout) or app.timeout,
        priority=o.priority,
        retention=seconds(o.retention) or store.DEFAULT_RETENTION,
    )
    wf.task = _SegmentTask(app, wf)
    existing = app.tasks.get(wf.task.name)
    if existing is not None and qualname(existing.fn) != qualname(wf.task.fn):
        raise ConfigurationError(f"a task is already named {wf.task.name!r}")
    prior = workflows(app).get(name)
    if prior is not None and qualname(prior.fn) != qualname(fn):
        raise ConfigurationError(
            f"two workflows are named {name!r} ({qualname(prior.fn)} and {qualname(fn)}); "
            "give one of them name="
        )
    app.tasks[wf.task.name] = wf.task
    workflows(app)[name] = wf
    if app.broker.capabilities.events and ROUTER_QUEUE not in app.event_routes:
        app.event_routes[ROUTER_QUEUE] = router_task(app)
    return wf
