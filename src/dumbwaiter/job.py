"""``Job``: the handle ``enqueue`` returns.

It is only an id and the app: cheap to create, safe to keep, and any process
that knows the id can build one (``app.job(id)``).  ``Job[int]`` is a job
whose ``result()`` is an ``int``: ``enqueue`` of a typed task says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from .errors import JobCancelled, JobFailed, JobNotFound, ResultNotKept, ResultTimeout
from .state import FINAL_STATES, State
from .typevars import T

if TYPE_CHECKING:
    from .brokers.base import Broker
    from .brokers.types import JobInfo

_V = TypeVar("_V")


class Owner(Protocol):
    """What a handle needs of its app (``App`` is one): the broker, and the
    bridge that runs its coroutines from sync code."""

    @property
    def broker(self) -> Broker: ...

    def _call(self, coro: Coroutine[Any, Any, _V]) -> _V: ...


class Job(Generic[T]):
    __slots__ = ("app", "id")

    #: ``result()`` waits for a job the broker does not have yet, instead of
    #: raising ``JobNotFound`` (a handle made before its job is stored: the outbox's)
    _arrives_later = False

    def __init__(self, app: Owner, id: str) -> None:
        self.app = app
        self.id = id

    def __repr__(self) -> str:
        return f"<Job {self.id}>"

    def _not_arrived(self, timeout: float | None) -> str:
        return f"job {self.id} is not stored after {timeout} s"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    # -- sync ----------------------------------------------------------------

    def info(self) -> JobInfo | None:
        """Everything stored about the job, or None if it is not stored."""
        return self.app._call(self.app.broker.get(self.id))

    def status(self) -> State:
        """``scheduled``, ``ready``, ``running``, ``retrying``, ``succeeded``,
        ``dead`` or ``cancelled``; raises ``JobNotFound`` if not stored."""
        return _status(self.id, self.info())

    def result(self, timeout: float | None = None) -> T:
        """Wait up to ``timeout`` seconds (None: for ever) for the job to finish
        and return what the task returned.

        Raises ``JobFailed`` if it was dead-lettered, ``JobCancelled``,
        ``ResultNotKept`` if its task does not keep results, ``ResultTimeout``."""
        return self.app._call(self.aresult(timeout))

    def cancel(self) -> bool:
        """Cancel the job if it has not started; True if it was cancelled."""
        return bool(self.app._call(self.app.broker.cancel([self.id])))

    # -- async ---------------------------------------------------------------

    async def ainfo(self) -> JobInfo | None:
        return await self.app.broker.get(self.id)

    async def astatus(self) -> State:
        return _status(self.id, await self.ainfo())

    async def acancel(self) -> bool:
        return bool(await self.app.broker.cancel([self.id]))

    async def aresult(self, timeout: float | None = None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        while True:
            info = await self.ainfo()
            if info is None and not self._arrives_later:
                raise JobNotFound(_not_stored(self.id))
            if info is not None and info.state in FINAL_STATES:
                return cast(T, _outcome(self.id, info.state, info))
            if deadline is not None and time.monotonic() >= deadline:
                if info is None:
                    raise ResultTimeout(self._not_arrived(timeout))
                raise ResultTimeout(f"job {self.id} is still {info.state} after {timeout} s")
            wait = pause if deadline is None else min(pause, deadline - time.monotonic())
            await asyncio.sleep(max(wait, 0))
            pause = min(pause * 2, 0.1)


def _not_stored(id: str) -> str:
    return f"no job {id} is stored (never enqueued, or pruned after retention)"


def _status(id: str, info: JobInfo | None) -> State:
    if info is None:
        raise JobNotFound(_not_stored(id))
    return info.state


def _outcome(id: str, state: State, info: JobInfo) -> Any:
    if state is State.DEAD:
        last = info.message.errors[-1] if info.message.errors else None
        why = f"{last.type}: {last.message}" if last else "no error recorded"
        raise JobFailed(f"job {id} ({info.message.name}) is dead: {why}")
    if state is State.CANCELLED:
        raise JobCancelled(f"job {id} was cancelled")
    done = info.outcome()
    if "value" in done:
        return done["value"]
    if "error" in done:
        raise ResultNotKept(f"job {id} succeeded but its result was not stored: {done['error']}")
    raise ResultNotKept(
        f"job {id} succeeded but its task {info.message.name} does not keep results "
        "(@app.task(keep_result=...))"
    )
