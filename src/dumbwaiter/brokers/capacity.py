"""Bounded queues: ``max_ready``, the most jobs a queue may hold waiting.

A producer that outruns its workers grows a queue without end: memory and
disk fill, the lag grows until every job is late.  ``max_ready`` bounds the
jobs that *wait* in a queue (ready, scheduled or retrying; running ones are
the workers' already), and an enqueue that would pass it raises
``QueueFull`` at the producer: nothing of its batch is stored, nothing is
dropped later in silence.

The bound must hold under any number of producers on any number of hosts,
so the count and the enqueue must be one atomic step.  An engine that can
do that itself (a count in its enqueue transaction or script) overrides
``Broker.enqueue_bounded`` and reports ``capabilities.native_capacity``;
every other engine gets ``enqueue_locked`` here: the producers of a bounded
queue take one lock per queue (the seam's fenced ``acquire``), count the
waiting jobs with the admin API, enqueue, and release.  Only producers raise
the count (a retry or a rescued job goes back whatever the bound: a job
already admitted is never lost), so counting under the lock admits no more
than ``max_ready``.

``admit`` is the check both paths share: how many wait, how many a batch
adds per queue, and the ``QueueFull`` that names the queue and the limit.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Literal, Protocol, get_args

from .. import keys
from ..errors import BrokerUnavailable, ConfigurationError, QueueFull
from ..message import Message
from . import deadline

#: what an enqueue into a full queue does: raise ``QueueFull`` at once, or
#: wait for room until the producer's deadline (``enqueue_timeout``)
WhenFull = Literal["raise", "wait"]

#: seconds the per-queue lock is held at most when the producer has no
#: deadline of its own (a crashed producer frees it after this)
LOCK_TTL = 30.0
#: seconds a producer without a deadline waits for a busy lock before it
#: raises ``BrokerUnavailable`` (a lock held this long is a stuck producer)
LOCK_WAIT = 60.0


class Waiting(Protocol):
    """What a queue's counts must offer (``QueueStats``)."""

    @property
    def queue(self) -> str: ...
    @property
    def ready(self) -> int: ...
    @property
    def scheduled(self) -> int: ...
    @property
    def retrying(self) -> int: ...


class Lockable(Protocol):
    """The seam methods ``enqueue_locked`` uses (``Broker``'s)."""

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None: ...
    async def release(self, name: str, owner: str, token: int) -> None: ...
    async def stats(self) -> Sequence[Waiting]: ...
    async def enqueue(self, msgs: Iterable[Message]) -> list[str]: ...


def check_bound(queue: str, max_ready: object, when_full: object) -> None:
    """Raise ``ConfigurationError`` for a bound that cannot work."""
    if not isinstance(max_ready, int) or isinstance(max_ready, bool) or max_ready < 1:
        raise ConfigurationError(
            f"queue {queue!r}: max_ready must be a positive integer, got {max_ready!r}"
        )
    if when_full not in get_args(WhenFull):
        raise ConfigurationError(
            f"queue {queue!r}: when_full must be one of {get_args(WhenFull)}, got {when_full!r}"
        )


def waiting(row: Waiting) -> int:
    """The jobs of a queue that count against its ``max_ready``."""
    return row.ready + row.scheduled + row.retrying


def per_queue(msgs: Sequence[Message], max_ready: Mapping[str, int]) -> Counter[str]:
    """How many of ``msgs`` go to each bounded queue."""
    return Counter(m.queue for m in msgs if m.queue in max_ready)


def admit(
    adding: Mapping[str, int], counts: Mapping[str, int], max_ready: Mapping[str, int]
) -> None:
    """Raise ``QueueFull`` for the first queue (by name) ``adding`` would take
    past its bound, given ``counts`` of jobs waiting now."""
    for queue in sorted(adding):
        limit, have, asked = max_ready[queue], counts.get(queue, 0), adding[queue]
        if have + asked > limit:
            raise QueueFull(queue, limit, have, asked)


async def enqueue_locked(
    broker: Lockable, msgs: Sequence[Message], max_ready: Mapping[str, int]
) -> list[str]:
    """``enqueue`` ``msgs`` unless a bounded queue would pass its bound, under
    one lock per bounded queue (taken in name order: no two producers wait
    for each other)."""
    adding = per_queue(msgs, max_ready)
    if not adding:
        return await broker.enqueue(msgs)
    owner = uuid.uuid4().hex
    held: list[tuple[str, int]] = []
    try:
        for queue in sorted(adding):
            name = keys.CAPACITY_LOCK + queue
            held.append((name, await _take(broker, name, owner)))
        rows = await broker.stats()
        admit(adding, {r.queue: waiting(r) for r in rows}, max_ready)
        return await broker.enqueue(msgs)
    finally:
        for name, token in reversed(held):
            await broker.release(name, owner, token)


async def _take(broker: Lockable, name: str, owner: str) -> int:
    """The lock ``name``, waited for until the producer's deadline."""
    until = deadline.current()
    ttl = LOCK_TTL if until is None else max(LOCK_TTL, until - time.monotonic() + 5.0)
    stop = until if until is not None else time.monotonic() + LOCK_WAIT
    pause = 0.002
    while True:
        token = await broker.acquire(name, owner, ttl)
        if token is not None:
            return token
        left = stop - time.monotonic()
        if left <= 0:
            raise BrokerUnavailable(
                f"the bounded queue's lock {name!r} stayed busy until the producer's "
                "deadline (many producers at once, or one stuck holding it)"
            )
        # jitter: producers that lost the same race must not retry together
        await asyncio.sleep(min(left, pause * (0.5 + random.random())))
        pause = min(pause * 2, 0.05)


async def wait_for_room(send: Callable[[], Awaitable[list[str]]]) -> list[str]:
    """``send()`` again while it raises ``QueueFull``, until the producer's
    deadline (``when_full="wait"``); with no deadline, until there is room."""
    pause = 0.05
    while True:
        try:
            return await send()
        except QueueFull:
            until = deadline.current()
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                raise
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, 1.0)
