"""What the Kafka broker's free-function modules (``jobs.py``, ``admin.py``)
need of the broker: a narrow Protocol, so they are typed without importing
``broker.py`` (which imports them) and without an import circle.
``KafkaBroker`` is the one implementation.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from ...message import Message
from ..base import Broker
from ..clock import ServerClock
from ..types import Binding
from .held import Held
from .names import Names
from .produce import Sending

#: copies to write: (topic, key, value, headers)
Out = list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]


class KafkaEngine(Protocol):
    """The broker as its job and admin functions see it."""

    names: Names
    #: the state store (behind its admission gate until the cluster agreed)
    state: Broker
    #: aiokafka client settings
    config: dict[str, Any]
    #: the state store's clock (``clock.py``)
    clock: ServerClock
    retention: float
    event_retention: float
    stranded: float
    #: seconds a new job's copy may wait in a worker for its record (``jobs.enqueue``)
    record_grace: float
    reconcile_at: float
    instance: str
    known_queues: set[str]
    #: what this process last wrote to the entries of the jobs it holds
    held: Held

    def now(self) -> Awaitable[float]: ...
    def send(self, items: Out) -> Awaitable[None]: ...
    def start_send(self, items: Out) -> Awaitable[Sending]: ...
    def send_soon(self, items: Out) -> None: ...
    def copy_of(
        self,
        msg: Message,
        ver: int,
        run_at: float,
        now: float,
        body: bytes | None = None,
        written: float | None = None,
    ) -> Out: ...
    def dead_copy(self, msg: Message, raw: bytes | None = None) -> Out: ...
    def bindings(self) -> Awaitable[list[Binding]]: ...
    def event_topic(self, event_type: str) -> Awaitable[str]: ...
