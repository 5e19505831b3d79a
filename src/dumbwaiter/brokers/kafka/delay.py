"""Delayed copies (``eta``, retries at a later time) without a server plugin.

Kafka hands records out in order and has no timers, so a copy due later is
written to a *delay tier*: a topic whose every record is held at most a
fixed time (``names.TIERS``: 0.5 s, 2 s, 8 s ... 9 h).  A copy due in ``r``
seconds enters the largest tier not longer than ``r``.  Within a tier's
partition, records were written in time order and each is held the same
time, so the head of the partition is always the next to come due: the
relay pauses the partition until its head is due (``pause``, nothing is
read meanwhile), then writes the copy on to its queue's topic if it is due,
or to the tier of what remains, and commits the tier's offset only after
that write is acknowledged (a crash in between writes the copy twice, and
the job record drops the second).  A copy leaves tier 0 at its due time;
one entering a longer tier is at most one tier's hold early there, so it
is on time to the tier it goes on to.

One relay runs in each process that fetches (a consumer group of relays:
each tier partition is relayed by one of them at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from .connection import started
from .names import TIERS, tier_for
from .produce import in_view

log = logging.getLogger("dumbwaiter.kafka")

#: headers of a copy in a tier: the topic it goes to and when it is due
TO, DUE = "dw-to", "dw-due"
#: seconds the relay reads at most before it looks at its paused partitions again
READ_EVERY = 0.2


def tier_headers(headers: list[tuple[str, bytes]], to: str, due: float) -> list[tuple[str, bytes]]:
    """A copy's headers as it goes into a tier."""
    kept = [(k, v) for k, v in headers if k not in (TO, DUE)]
    return [*kept, (TO, to.encode()), (DUE, f"{due:.6f}".encode())]


class Relay:
    """The relay of one process (see the module docstring)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        tier_topic: Callable[[int], str],
        clock: Callable[[], float] = time.time,
        remake: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        self.tier_topic = tier_topic
        #: the state store's time (``clock.py``): the due times were written on it
        self.clock = clock
        #: makes again the topics a restarted cluster lost (``produce.in_view``)
        self.remake = remake
        self._topics = {tier_topic(i): i for i in range(len(TIERS))}
        self._paused: dict[TopicPartition, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self.consumer.stop()

    async def _run(self) -> None:
        await started(self.consumer)  # (stop() cancels it: that leaves nothing open)
        self.consumer.subscribe(topics=sorted(self._topics))
        while not self._stopping:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except (KafkaError, IllegalStateError, OSError) as exc:
                log.warning("kafka delay relay: %r; trying again", exc)
                self._paused.clear()
                await asyncio.sleep(1.0)

    async def _round(self) -> None:
        now = self.clock()
        held = self.consumer.assignment()
        for tp in [tp for tp in self._paused if tp not in held]:
            del self._paused[tp]
        due = [tp for tp, at in self._paused.items() if at <= now]
        if due:
            self.consumer.resume(*due)
            for tp in due:
                del self._paused[tp]
        wait = READ_EVERY
        if self._paused:
            wait = max(0.0, min(wait, min(self._paused.values()) - now))
        got = await self.consumer.getmany(timeout_ms=round(wait * 1000))
        for tp, recs in got.items():
            if tp in self._paused:
                continue
            await self._relay(tp, recs)

    async def _relay(self, tp: TopicPartition, recs: list[Any]) -> None:
        tier = self._topics.get(tp.topic, 0)
        sent: list[asyncio.Future[Any]] = []
        last = None
        for rec in recs:
            headers = [(k, bytes(v)) for k, v in rec.headers or ()]
            found = dict(headers)
            to = found.get(TO, b"").decode()
            try:
                due = float(found.get(DUE, b"0"))
            except ValueError:
                due = 0.0
            now = self.clock()
            release = min(due, rec.timestamp / 1000.0 + TIERS[tier])
            if release > now:
                self.consumer.seek(tp, rec.offset)
                self.consumer.pause(tp)
                self._paused[tp] = release
                break
            if not to:  # not a copy of ours: nothing to relay it to
                last = rec.offset
                continue
            if due <= now:
                topic, out = to, [(k, v) for k, v in headers if k not in (TO, DUE)]
            else:
                topic, out = self.tier_topic(tier_for(due - now)), headers
            await in_view(self.producer, (topic,), self.remake)
            sent.append(await self.producer.send(topic, rec.value, key=rec.key, headers=out))
            last = rec.offset
        if sent:
            await asyncio.gather(*sent)
        if last is not None:
            try:
                await self.consumer.commit({tp: last + 1})
            except KafkaError as exc:  # rebalanced: the next relay writes them again
                log.debug("kafka delay relay: commit failed: %r", exc)
