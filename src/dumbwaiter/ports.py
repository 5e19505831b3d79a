"""What the modules under ``App`` may ask of it: a few narrow protocols.

``app.py`` is the façade: it imports tasks, events, jobs, workflows,
batches, the outbox and the worker, and they must not import it back (the
import graph has no circle; tests/unit/test_import_graph.py keeps it so).
What a task, a job handle, a context or an event needs of its app is
written here instead, as ``Runtime``: the broker, the producer's settings
and its send paths.  ``App`` has all of it; a test may hand a lower module
anything else that does.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from .brokers.base import Broker
from .job import Job
from .message import Message
from .retry import Retry

T = TypeVar("T")


class EnqueueHooks(Protocol):
    """The producer's view of the app's middleware."""

    @property
    def enqueue_hooks(self) -> bool:
        """Whether any middleware has an enqueue hook (else a single enqueue
        skips the hook plumbing)."""
        ...

    def has(self, hook: str) -> bool: ...

    def call(self, hook: str, *args: Any) -> None: ...


class TaskRef(Protocol):
    """A registered task as workflows, batches and the outbox see it: a name
    and a way to build its message."""

    @property
    def name(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def app(self) -> Runtime: ...

    def message(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Message: ...


class Retrying(Protocol):
    """A handler with a retry policy (a subscription, as event replay sees it)."""

    @property
    def retry(self) -> Retry: ...


class Runtime(Protocol):
    """The app as the modules under it see it (``App`` is one)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def middleware(self) -> EnqueueHooks: ...

    @property
    def eager(self) -> bool:
        """Each send runs what it sent before it returns (unit tests)."""
        ...

    @property
    def enqueue_timeout(self) -> float | None: ...

    @property
    def max_ready(self) -> Mapping[str, int]:
        """Bounded queues: their sends go through ``enqueue_bounded``."""
        ...

    @property
    def max_message_size(self) -> int | None: ...

    @property
    def retry(self) -> Retry:
        """The app's default retry policy."""
        ...

    @property
    def event_retention(self) -> float: ...

    @property
    def tasks(self) -> Mapping[str, TaskRef]: ...

    @property
    def subscriptions(self) -> Mapping[tuple[str, str], Retrying]: ...

    def upgrade(
        self, event_type: str, version: int, target: int, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """Run the upcasters of ``event_type`` from ``version`` to ``target``."""
        ...

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a broker coroutine from sync code."""
        ...

    async def _send(self, msgs: Iterable[Message]) -> list[Job[Any]]:
        """Enqueue through the middleware (and eager mode)."""
        ...

    def _send_sync(self, msgs: Iterable[Message]) -> list[Job[Any]]: ...

    async def _send_flow(self, msgs: list[Message]) -> list[Job[Any]]:
        """Enqueue jobs of tasks with ``unique=<window>`` or ``debounce``."""
        ...

    def _send_flow_sync(self, msgs: Iterable[Message]) -> list[Job[Any]]: ...
