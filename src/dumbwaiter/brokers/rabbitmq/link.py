"""One event loop's AMQP connection: a confirming publisher channel, a
consumer channel, the consumers and the messages they were handed.

A broker may serve several event loops (a worker's, and the App's portal for
sync callers), and an aiormq connection belongs to one loop, so each loop
gets an ``AmqpLink``.  When the connection or a channel dies the link is dropped
whole and the next call opens a new one with a new ``gen``: delivery tags of
an older generation are never acked (RabbitMQ has already put those
messages back), which the ``unacked`` set also guards against double acks
(an unknown tag would close the channel).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
from pamqp import commands as spec

from ...errors import BrokerError, BrokerUnavailable
from .. import deadline, failure, hooks
from . import outgoing, wire
from .tags import Unacked

log = logging.getLogger("dumbwaiter.rabbitmq")

_GENS = itertools.count(1)
#: seconds to open a connection and its channels (a stuck server must not
#: hang a worker: the call fails and is tried again)
CONNECT_TIMEOUT = 10.0
#: seconds to wait for the confirms of one batch before the connection is
#: given up and the batch sent again on a new one (a copy sent twice is harmless)
CONFIRM_TIMEOUT = 30.0
#: publishes awaiting their confirms at once (a bigger batch goes in windows:
#: thousands of pending futures and queued frames cost more than they save)
IN_FLIGHT = 1000

#: seconds to close a connection (and for the tasks its close starts to end)
CLOSE_TIMEOUT = 5.0

#: what a dead connection or channel raises
AMQP_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)


def failure_of(url: str, exc: BaseException | str, waited: float | None = None) -> BrokerError:
    """What a failed call on RabbitMQ at ``url`` means (failure.py): refused
    credentials or a vhost the server will not open (for good), a server out
    of reach (for now), or anything else.  A ``BrokerUnavailable`` made
    earlier is worded again with the time waited."""
    if isinstance(exc, BrokerUnavailable) and waited is not None and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, BrokerError):
        return exc
    errors = aiormq.exceptions
    if isinstance(exc, errors.AuthenticationError | errors.ProbableAuthenticationError):
        return failure.refused(url, exc, auth=True)
    if _vhost_refused(exc):
        vhost = unquote(urlsplit(url).path[1:]) or "/"
        why = f"RabbitMQ refused to open vhost {vhost!r} (it does not exist, or the user may not)"
        return failure.refused(url, why)
    if isinstance(exc, asyncio.TimeoutError):
        return failure.unavailable(url, "no answer in time", waited)
    if isinstance(exc, str | errors.AMQPConnectionError | OSError):
        return failure.unavailable(url, exc, waited)
    return failure.failed(url, exc, "rabbitmq")


def _vhost_refused(exc: BaseException | str) -> bool:
    """RabbitMQ answers ``connection.open`` of a vhost that does not exist (or
    that the user has no access to) with ``connection.close`` (530,
    NOT_ALLOWED); aiormq reports it as an unexpected frame, or as the close."""
    errors = aiormq.exceptions
    if isinstance(exc, errors.ConnectionClosed) and exc.args[:1] == (530,):
        return True
    text = str(exc)
    return (
        isinstance(exc, errors.InvalidFrameError)
        and "Connection.OpenOk" in text
        and "Connection.Close" in text
    )


#: a copy ``AmqpLink.start_one`` queued: its channel and pending confirmation
Started = tuple[aiormq.Channel, "asyncio.Future[Any]"]


@dataclass(slots=True)
class Raw:
    """A message as RabbitMQ handed it to us, before the ledger judged it."""

    queue: str
    lane: str
    tag: int
    gen: int
    redelivered: bool
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str = ""
    #: handed over by a consumer: may wait in ``AmqpLink.waiting`` for its record
    can_wait: bool = False
    #: when it first waited there, and when to judge it again (``time.time()``)
    waited_since: float = 0.0
    recheck_at: float = 0.0


class AmqpLink:
    """One event loop's connection to RabbitMQ (the module's doc)."""

    def __init__(self, url: str, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.name = name
        self.loop = loop
        self.conn: AbstractConnection | None = None
        self.pub: AbstractChannel | None = None
        self.cons: AbstractChannel | None = None
        self.gen = 0
        self.lock = asyncio.Lock()
        self.buffer: deque[Raw] = deque()
        #: copies whose record was not written yet when they came (their
        #: producer writes it beside the publish), judged again shortly
        self.waiting: list[Raw] = []
        self.arrived = asyncio.Event()
        #: lane queue name -> consumer tag
        self.consumers: dict[str, str] = {}
        #: lane queue name -> (logical queue, lane) of its consumer
        self.lanes: dict[str, tuple[str, str]] = {}
        #: delivery tags of ``cons`` not yet acked or nacked (``tags.py``:
        #: which of them one ``multiple`` ack may cover)
        self.unacked = Unacked()
        #: logical queue -> time to look again whether it is still paused
        self.paused_until: dict[str, float] = {}
        #: the consumers' prefetch, and the worker's slots it was sized for
        self.prefetch = 0
        self.slots = 0
        #: messages acked or nacked since ``settled_since`` (the drain rate
        #: that sizes the prefetch, ``RabbitMQTransport._watch``)
        self.settled = 0
        self.settled_since = 0.0
        #: when ``_watch`` last read pauses and lanes, and for which queues
        self.looked_at = 0.0
        self.looked: set[str] = set()
        #: acks waiting for this loop's next admission to write their
        #: records (``RabbitMQOutcomes._ack_with_admission``)
        self.acks_on_admission: list[Any] = []  # ledger.AckOnAdmission
        #: the private hooks this connection uses (``ensure`` decides, from
        #: ``DUMBWAITER_HOOKS_OFF``): ``outgoing.publish``, consumers called
        #: inline (``_hand_over_inline``)
        self.fast_publish = False
        self.inline = False
        #: the connection's socket, read by ``wire.Wire`` (aiormq's public
        #: ``transport_factory``): deliveries to the consumers without
        #: aiormq's frame reader; None with the switch ``direct`` off
        self.wire: wire.Wire | None = None
        #: (exchange, routing key) of copies this connection published
        #: after declaring their queue: the next one needs no declare
        self.targets: set[tuple[str, str]] = set()

    def ok(self) -> bool:
        return (
            self.conn is not None
            and self.conn.is_opened
            and self.pub is not None
            and not self.pub.is_closed
            and self.cons is not None
            and not self.cons.is_closed
        )

    async def ensure(self) -> None:
        if self.ok():
            return
        async with self.lock:
            if self.ok():
                return
            await self.drop()
            inline, fast_publish = _INLINE and hooks.on("inline"), hooks.on("publish")
            w = wire.Wire() if hooks.on("direct") else None
            extra: dict[str, Any] = {} if w is None else {"transport_factory": wire.Factory(w)}
            try:
                # a producer's connect waits no longer than its deadline
                async with asyncio.timeout(deadline.remaining(CONNECT_TIMEOUT)):
                    conn = await aiormq.connect(
                        self.url, client_properties={"connection_name": self.name}, **extra
                    )
                    pub = await conn.channel(publisher_confirms=True)
                    cons = await conn.channel(publisher_confirms=False)
            except AMQP_ERRORS as exc:
                raise failure_of(self.url, exc) from exc
            self.inline, self.fast_publish = inline, fast_publish
            if inline:
                _hand_over_inline(cons)
            if w is not None:
                w.channel = cons
            self.wire = w
            self.conn, self.pub, self.cons = conn, pub, cons
            self.gen = next(_GENS)
            conn.closing.add_done_callback(self._closed)

    def _closed(self, _fut: object) -> None:
        self.arrived.set()  # a waiting fetch returns and reconnects

    async def drop(self) -> None:
        """Forget the connection (its unacked messages go back to their queues)."""
        conn = self.conn
        self.conn = self.pub = self.cons = None
        if self.wire is not None:
            self.wire.consumers.clear()
        self.targets.clear()
        self.buffer.clear()
        self.waiting.clear()
        self.consumers.clear()
        self.lanes.clear()
        self.unacked.clear()
        self.prefetch = 0
        self.slots = 0
        self.settled = 0
        self.settled_since = 0.0
        self.looked_at = 0.0
        self.looked = set()
        if conn is not None:
            before = asyncio.all_tasks()
            try:
                await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT)
            except BaseException:  # closing a dead connection may fail any way
                pass
            await _settle(before)

    def channel(self) -> AbstractChannel:
        if self.pub is None or self.pub.is_closed:
            raise BrokerError("rabbitmq: the connection is closed")
        return self.pub

    def consumer_channel(self) -> AbstractChannel:
        if self.cons is None or self.cons.is_closed:
            raise BrokerError("rabbitmq: the connection is closed")
        return self.cons

    async def consume(self, lane_queue: str, queue: str, lane: str, prefetch: int) -> None:
        if lane_queue in self.consumers:
            return
        ch = self.consumer_channel()
        if prefetch != self.prefetch:
            await ch.basic_qos(prefetch_count=prefetch)
            self.prefetch = prefetch
        gen = self.gen

        def take(
            tag: int, redelivered: bool, body: bytes, headers: dict[str, Any], message_id: str
        ) -> None:
            if gen != self.gen:
                return
            self.unacked.add(tag)
            self.buffer.append(
                Raw(
                    queue=queue,
                    lane=lane,
                    tag=tag,
                    gen=gen,
                    redelivered=redelivered,
                    body=body,
                    headers=headers,
                    message_id=message_id,
                    can_wait=True,
                )
            )
            self.arrived.set()

        def on_message(m: DeliveredMessage) -> Any:
            d = m.delivery
            assert isinstance(d, spec.Basic.Deliver)
            props = m.header.properties
            tag = int(d.delivery_tag or 0)
            headers = dict(props.headers or {})
            take(tag, bool(d.redelivered), m.body, headers, props.message_id or "")
            return _HANDED

        ok = await ch.basic_consume(lane_queue, on_message, no_ack=False)
        tag = str(ok.consumer_tag)
        if self.inline:
            _inline_consumer(ch, tag, on_message)
        if self.wire is not None:
            self.wire.consumers[tag] = take
        self.consumers[lane_queue] = tag
        self.lanes[lane_queue] = (queue, lane)

    async def cancel(self, lane_queue: str) -> None:
        tag = self.consumers.pop(lane_queue, None)
        self.lanes.pop(lane_queue, None)
        if tag is not None and self.wire is not None:
            self.wire.consumers.pop(tag, None)  # what comes before its CancelOk: aiormq's
        if tag is not None and self.cons is not None and not self.cons.is_closed:
            await self.cons.basic_cancel(tag)

    async def resize(self, prefetch: int) -> None:
        """Give every consumer the prefetch ``prefetch``.

        RabbitMQ applies a ``basic.qos`` to the consumers started after it
        only, so each lane gets a new consumer first, then the old one is
        cancelled: no gap in the deliveries, and the old consumer's messages
        stay unacked on the channel, ours as before (aiormq hands over every
        delivery that comes before the ``basic.cancel-ok``)."""
        if prefetch == self.prefetch:
            return
        old = dict(self.consumers)
        lanes = dict(self.lanes)
        self.consumers.clear()
        for lane_queue, (queue, lane) in lanes.items():
            await self.consume(lane_queue, queue, lane, prefetch)
        ch = self.consumer_channel()
        for tag in old.values():
            if self.wire is not None:
                self.wire.consumers.pop(tag, None)
            await ch.basic_cancel(tag)

    async def get(self, lane_queue: str, queue: str, lane: str) -> Raw | None:
        m = await self.consumer_channel().basic_get(lane_queue, no_ack=False)
        d = m.delivery
        if not isinstance(d, spec.Basic.GetOk):
            return None
        props = m.header.properties
        tag = int(d.delivery_tag or 0)
        self.unacked.add(tag)
        return Raw(
            queue=queue,
            lane=lane,
            tag=tag,
            gen=self.gen,
            redelivered=bool(d.redelivered),
            body=m.body,
            headers=dict(props.headers or {}),
            message_id=props.message_id or "",
        )

    async def ack(self, gen: int, tags: list[int]) -> None:
        """Ack the tags of generation ``gen`` still unacked (others are gone)."""
        if gen != self.gen or self.cons is None or self.cons.is_closed:
            return
        upto, one_by_one, n = self.unacked.settle(tags)
        self.settled += n
        if upto:
            await self.cons.basic_ack(upto, multiple=True, wait=False)
        for t in one_by_one:
            await self.cons.basic_ack(t, wait=False)

    async def nack(self, gen: int, tags: list[int]) -> None:
        if gen != self.gen or self.cons is None or self.cons.is_closed:
            return
        for tag in tags:
            if self.unacked.discard(tag):
                self.settled += 1
                await self.cons.basic_nack(tag, requeue=True, wait=False)

    async def start_one(
        self, item: tuple[str, str, bytes, spec.Basic.Properties]
    ) -> Started | None:
        """Queue one copy to a target this connection published to before
        for aiormq's writer (``outgoing.start``, the ``publish`` hook): the
        channel and the copy's pending confirmation, for ``confirm_one``;
        None when it must go through ``publish``."""
        ex, rk, body, props = item
        if not self.fast_publish or (ex, rk) not in self.targets or not self.ok():
            return None
        ch = cast(aiormq.Channel, self.pub)
        confirmation = await outgoing.start(ch, ex, rk, body, props)
        return None if confirmation is None else (ch, confirmation)

    async def confirm_one(self, started: Started) -> None:
        """Wait for a ``start_one`` copy's confirm, as ``publish`` does, and
        as long (``TimeoutError`` past it).

        The wait's end is a timer that cancels the pending confirmation
        (as the timeout of ``publish`` does, through the task it cancels):
        that alone, without ``asyncio.timeout``'s context around the wait,
        is the usual call's share.  A cancelled confirmation in a task that
        nobody cancelled is the timer's."""
        ch, confirmation = started
        loop = asyncio.get_running_loop()
        timer = loop.call_later(deadline.remaining(CONFIRM_TIMEOUT), confirmation.cancel)
        try:
            r = await outgoing.confirmed(ch, confirmation)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if confirmation.cancelled() and task is not None and not task.cancelling():
                raise TimeoutError from exc
            raise
        finally:
            timer.cancel()
        if not isinstance(r, spec.Basic.Ack):
            raise BrokerError(f"rabbitmq refused a message: {r!r}")

    async def publish(self, items: list[tuple[str, str, bytes, spec.Basic.Properties]]) -> None:
        """Publish and wait for every confirm (pipelined: one round trip)."""
        if not items:
            return
        # the concrete channel: its basic_publish takes ``wait``
        ch = cast(aiormq.Channel, self.channel())
        if len(items) == 1:  # the usual enqueue: no task and gather around it
            ex, rk, body, props = items[0]
            async with asyncio.timeout(deadline.remaining(CONFIRM_TIMEOUT)):
                r = await self._publish_one(ch, ex, rk, body, props)
            if not isinstance(r, spec.Basic.Ack):
                raise BrokerError(f"rabbitmq refused a message: {r!r}")
            return
        for start in range(0, len(items), IN_FLIGHT):
            window = items[start : start + IN_FLIGHT]
            results = await asyncio.wait_for(
                self._publish(ch, window), deadline.remaining(CONFIRM_TIMEOUT)
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
                if not isinstance(r, spec.Basic.Ack):
                    raise BrokerError(f"rabbitmq refused a message: {r!r}")

    async def _publish_one(
        self, ch: aiormq.Channel, ex: str, rk: str, body: bytes, props: spec.Basic.Properties
    ) -> Any:
        """One confirmed publish: its confirmation frame."""
        if self.fast_publish:
            return await outgoing.publish(ch, ex, rk, body, props)
        # wait=False: queue the frames without waiting for them to reach
        # the socket; the confirm is what is awaited
        return await ch.basic_publish(
            body, exchange=ex, routing_key=rk, properties=props, wait=False
        )

    async def _publish(
        self, ch: aiormq.Channel, items: list[tuple[str, str, bytes, spec.Basic.Properties]]
    ) -> list[Any]:
        if self.fast_publish:
            together = await outgoing.publish_many(ch, items)
            if together is not None:
                return together
        return await asyncio.gather(
            *(self._publish_one(ch, ex, rk, body, props) for ex, rk, body, props in items),
            return_exceptions=True,
        )


async def _settle(before: set[asyncio.Task[Any]]) -> None:
    """Wait for the tasks aiormq started while a connection closed.

    ``Connection.close`` returns before the follow-ups it schedules (the
    reader's done callback closing the writer, the rejection of the
    channels' futures) have run; a loop that stops right after (a test's,
    the portal's) would destroy them pending, and their coroutines, never
    awaited, warn when they are collected.  Tasks of aiormq's that existed
    before the close belong to other connections and are left alone, and so
    are the loops of a connection another link opened meanwhile."""
    me = asyncio.current_task()
    deadline = asyncio.get_running_loop().time() + CLOSE_TIMEOUT
    while True:
        left = {
            t
            for t in asyncio.all_tasks() - before
            if t is not me and not t.done() and _is_aiormq(t)
        }
        timeout = deadline - asyncio.get_running_loop().time()
        if not left or timeout <= 0:
            return
        await asyncio.wait(left, timeout=timeout)


def _is_aiormq(task: asyncio.Task[Any]) -> bool:
    """A task of aiormq's that ends by itself (not a connection's loop)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return (
        code is not None
        and code.co_filename.startswith(_AIORMQ_DIR)
        and code.co_qualname not in _LOOPS
    )


_AIORMQ_DIR = os.path.dirname(aiormq.__file__) + os.sep
#: the tasks an open connection runs until it closes
_LOOPS = frozenset(
    {"Connection.__reader", "Connection.__writer", "Connection.__heartbeat", "Channel._reader"}
)


class _Handed:
    """What a consumer callback returns once it has handed its delivery over
    (``_hand_over_inline``): nothing is left to run, so no task is made."""

    __slots__ = ()

    def __await__(self) -> Any:
        return iter(())

    def add_done_callback(self, fn: Any) -> None:
        pass


_HANDED = _Handed()


def _hand_over_inline(ch: AbstractChannel) -> None:
    """The ``inline`` hook: let consumer callbacks of the link's own consumer
    channel ``ch`` run inline, without a task per delivery (aiormq's classes
    and other channels are left alone).

    aiormq wraps a consumer in a coroutine and runs it, for every message,
    as a task with three done callbacks (``Channel._on_deliver_frame``:
    ``self.create_task(consumer(message))``), a real share of the event
    loop's time a message.  The link's callback only appends the message to the
    buffer: ``_inline_consumer`` puts it unwrapped in the channel's
    consumers, so it runs at once and returns ``_HANDED``, which this
    channel's ``create_task`` passes through; anything else still becomes a
    task.  A delivery that comes before the consumer is unwrapped goes the
    usual way (the wrapper awaits ``_HANDED``, which is done at once)."""
    make = ch.create_task

    def create_task(coro: Any) -> Any:
        return coro if coro is _HANDED else make(coro)

    ch.create_task = create_task  # type: ignore[method-assign]


def _inline_consumer(ch: AbstractChannel, tag: str, on_message: Any) -> None:
    """Put ``on_message`` in place of aiormq's coroutine wrapper of it."""
    consumers = getattr(ch, "consumers", None)
    if isinstance(consumers, dict) and tag in consumers:
        consumers[tag] = on_message


def _inline_ok() -> bool:
    """Whether this aiormq hands deliveries to consumers through the
    channel's ``create_task`` and finds them in ``Channel.consumers`` (7.x
    does, in ``Channel._on_deliver_frame``); if not, consumers stay wrapped
    and run as tasks, the way aiormq runs them."""
    deliver = getattr(aiormq.Channel, "_on_deliver_frame", None)
    code = getattr(deliver, "__code__", None)
    return code is not None and {"create_task", "consumers"} <= set(code.co_names)


#: whether this aiormq calls consumers the way ``_hand_over_inline`` expects
_INLINE = _inline_ok()
