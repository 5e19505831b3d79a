"""``ctx``: what a workflow function receives first.

A sync workflow function gets a ``WorkflowContext`` (its operations return
values), an async one an ``AsyncWorkflowContext`` (the same operations, to
``await``).  Both are thin: the work is in ``replay.Replay``.  A sync
workflow runs in a thread of its own; its operations reach the store
through the worker's event loop, and its steps run right in its thread.

The code between operations runs again on every replay, so it must be
deterministic: take time and randomness from ``ctx.now()`` and
``ctx.uuid()``, and do anything with an effect inside a step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from ..errors import ConfigurationError
from ..retry import Retry
from .replay import STEP_KEY, Fenced, Replay, call_async, call_sync, new_uuid

if TYPE_CHECKING:
    from ..event import Event
    from .api import DurableWorkflow

T = TypeVar("T")
E = TypeVar("E", bound="Event")
_P = ParamSpec("_P")


def _epoch(when: datetime | float) -> float:
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ConfigurationError(
                "sleep_until() got a naive datetime; pass a timezone-aware one "
                "(e.g. ctx.now() + timedelta(days=3))"
            )
        return when.timestamp()
    if isinstance(when, int | float) and not isinstance(when, bool):
        return float(when)
    raise ConfigurationError(
        f"sleep_until() takes an aware datetime or epoch seconds, got {when!r}"
    )


def _delay(seconds: float | timedelta, what: str) -> float:
    s = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
    if not isinstance(s, int | float) or isinstance(s, bool) or s < 0:
        raise ConfigurationError(f"{what} takes seconds >= 0 or a timedelta, got {seconds!r}")
    return float(s)


class _Base:
    def __init__(self, replay: Replay) -> None:
        self._r = replay

    @property
    def run_id(self) -> str:
        return self._r.run

    @property
    def workflow(self) -> str:
        return self._r.wf.name

    @property
    def version(self) -> int:
        """The workflow version this run started on (``@app.workflow(version=)``):
        branch on it to keep old runs on the old path."""
        return int(self._r.rec.get("version") or 1)

    @property
    def step_key(self) -> str:
        """The idempotency key of the step running now: run id + ``:`` + step
        name, the same on every attempt and replay, for the APIs a step
        calls (``Idempotency-Key`` headers, unique constraints)."""
        key = STEP_KEY.get()
        if key is None:
            raise ConfigurationError("ctx.step_key is only known inside a step's function")
        return key

    def key_for(self, step: str) -> str:
        """The idempotency key of the step named ``step`` (see ``step_key``)."""
        return self._r.key_for(step)


class WorkflowContext(_Base):
    """The ``ctx`` of a sync workflow function."""

    def __init__(self, replay: Replay, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(replay)
        self._loop = loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._r.stopped:
            coro.close()
            raise Fenced()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        retry: Retry | bool | None = None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[T], Any] | None = None,
    ) -> T:
        """Run ``fn(*args)`` once for this run and return its (JSON) result; on
        replay, return the recorded result without running it.

        ``retry`` (default: the workflow's, else the app's ``dw.Retry``)
        retries a failing attempt after its backoff with no worker held;
        ``timeout`` bounds one attempt; ``compensate(result)`` undoes the
        step if the run fails later (the saga).  A step that fails for good
        raises ``StepFailed`` here."""
        r = self._r
        plan = self._call(r.step_begin(name, retry, timeout, compensate))
        if plan.done:
            return plan.value  # type: ignore[no-any-return]
        value: Any = None
        error: Exception | None = None
        r.in_step = True
        try:
            value = call_sync(fn, args, plan.timeout, plan.key, self._loop)
        except Exception as exc:
            error = exc
        finally:
            r.in_step = False
        return self._call(r.step_end(plan, value, error))  # type: ignore[no-any-return]

    def sleep(self, name: str, seconds: float | timedelta) -> None:
        """Sleep (days are fine): the run parks and no worker is held."""
        self._call(self._r.sleep(name, _delay(seconds, "sleep()"), None))

    def sleep_until(self, name: str, when: datetime | float) -> None:
        self._call(self._r.sleep(name, None, _epoch(when)))

    def wait_for_event(
        self,
        name: str,
        event: type[E],
        *,
        match: dict[str, Any] | None = None,
        timeout: float | timedelta | None = None,
    ) -> E | None:
        """Wait for an event of this type published after the wait began whose
        payload fields equal ``match``; None if ``timeout`` passed first."""
        t = None if timeout is None else _delay(timeout, "wait_for_event(timeout=)")
        return self._call(self._r.wait_event(name, event, match, t))  # type: ignore[no-any-return]

    @overload
    def child(
        self,
        name: str,
        workflow: DurableWorkflow[_P, Coroutine[Any, Any, T]],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> T: ...
    @overload
    def child(
        self, name: str, workflow: DurableWorkflow[_P, T], *args: _P.args, **kwargs: _P.kwargs
    ) -> T: ...
    def child(self, name: str, workflow: Any, *args: Any, **kwargs: Any) -> Any:
        """Start a child run of ``workflow`` and wait (parked) for its result;
        ``StepFailed`` if it failed."""
        return self._call(self._r.child(name, workflow, args, kwargs))

    def now(self) -> datetime:
        """The time, as first seen by this point of the run (UTC)."""
        return datetime.fromtimestamp(self._call(r_now(self._r)), UTC)

    def uuid(self) -> str:
        """A UUID (text) made once for this point of the run."""
        return str(self._call(self._r.value("uuid", new_uuid)))

    def patched(self, change: str) -> bool:
        """True for runs that reach this point on code with ``change`` (take the
        new path), False for runs that went past it before (keep the old)."""
        return self._call(self._r.patched(change))


class AsyncWorkflowContext(_Base):
    """The ``ctx`` of an async workflow function: ``await ctx.step(...)``."""

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | bool | None = None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Any:
        """See ``WorkflowContext.step``; ``fn`` may be async or sync (a sync one
        runs in a thread)."""
        r = self._r
        plan = await r.step_begin(name, retry, timeout, compensate)
        if plan.done:
            return plan.value
        value: Any = None
        error: Exception | None = None
        r.in_step = True
        try:
            value = await call_async(fn, args, plan.timeout, plan.key, r.pool)
        except Exception as exc:
            error = exc
        finally:
            r.in_step = False
        return await r.step_end(plan, value, error)

    async def sleep(self, name: str, seconds: float | timedelta) -> None:
        await self._r.sleep(name, _delay(seconds, "sleep()"), None)

    async def sleep_until(self, name: str, when: datetime | float) -> None:
        await self._r.sleep(name, None, _epoch(when))

    async def wait_for_event(
        self,
        name: str,
        event: type[E],
        *,
        match: dict[str, Any] | None = None,
        timeout: float | timedelta | None = None,
    ) -> E | None:
        t = None if timeout is None else _delay(timeout, "wait_for_event(timeout=)")
        return await self._r.wait_event(name, event, match, t)  # type: ignore[no-any-return]

    @overload
    async def child(
        self,
        name: str,
        workflow: DurableWorkflow[_P, Coroutine[Any, Any, T]],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> T: ...
    @overload
    async def child(
        self, name: str, workflow: DurableWorkflow[_P, T], *args: _P.args, **kwargs: _P.kwargs
    ) -> T: ...
    async def child(self, name: str, workflow: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._r.child(name, workflow, args, kwargs)

    async def now(self) -> datetime:
        return datetime.fromtimestamp(await r_now(self._r), UTC)

    async def uuid(self) -> str:
        return str(await self._r.value("uuid", new_uuid))

    async def patched(self, change: str) -> bool:
        return await self._r.patched(change)


async def r_now(r: Replay) -> float:
    import time

    return float(await r.value("now", time.time))
