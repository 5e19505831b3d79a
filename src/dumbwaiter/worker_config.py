"""What a worker is given: its settings (``WorkerConfig``) and the app as
it sees it (``WorkerApp``, with its middleware as ``Hooks``).  Apart from
worker.py so the parts of the worker (attempt.py) can name them without
importing the worker back.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import logs
from .context import Context
from .message import Message
from .ports import Runtime

if TYPE_CHECKING:
    from .brokers.types import Binding
    from .event import Subscription
    from .task import Task


class Hooks(Protocol):
    """The app's middleware as the worker runs it (``MiddlewareStack``)."""

    @property
    def enqueue_hooks(self) -> bool: ...

    @property
    def used(self) -> frozenset[str]: ...

    def has(self, hook: str) -> bool: ...

    def runs(self, hook: str, message: Message | None) -> bool: ...

    def call(self, hook: str, *args: Any) -> None: ...

    async def around(self, ctx: Context, innermost: Callable[[], Awaitable[Any]]) -> Any: ...

    async def acall(self, hook: str, ctx: Context | None, *args: Any) -> None: ...

    async def after_success(self, ctx: Context) -> None: ...


class WorkerApp(Runtime, Protocol):
    """The app as a worker sees it (``App`` is one): its registry's answers
    (what runs a message, which queues and bindings) and its middleware."""

    @property
    def middleware(self) -> Hooks: ...

    @property
    def url(self) -> str: ...

    def queues(self) -> list[str]: ...

    def bindings(self) -> list[Binding]: ...

    def handler(self, msg: Message) -> Task[..., Any] | Subscription | None: ...


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs (``DUMBWAITER_*`` variables map onto these)."""

    #: queues to work on; empty: every queue of the app's tasks and groups
    queues: tuple[str, ...] = ()
    concurrency: int = 32
    #: seconds a fetched job is ours without a heartbeat
    lease: float = 15.0
    #: seconds between heartbeats (well under ``lease``)
    heartbeat: float = 5.0
    #: seconds in-flight jobs get to finish after ``stop()``
    grace: float = 25.0
    #: longest a fetch blocks before the worker looks around again
    fetch_wait: float = 1.0
    #: seconds between rescues of expired leases
    rescue_interval: float = 1.0
    worker_id: str = field(default_factory=default_worker_id)
    #: ``text`` or ``json``: the worker writes the ``dumbwaiter`` loggers'
    #: lines to stderr in that format while it runs (``logs.install``); None
    #: leaves logging to the program (``dumbwaiter worker --log-format``
    #: sets it for the whole process instead)
    log_format: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.log_format is not None and self.log_format not in logs.FORMATS:
            raise ValueError(
                f"log_format must be one of {', '.join(logs.FORMATS)}, got {self.log_format!r}"
            )
        if self.heartbeat >= self.lease:
            raise ValueError(
                f"heartbeat ({self.heartbeat} s) must be shorter than the lease ({self.lease} s)"
            )
