"""The ``direct`` hook: deliveries handed to the link's consumers as their
last frame is read.

aiormq passes every frame of a channel through the channel's ``frames``
queue: the connection's reader task puts the three frames of a delivery
(``Basic.Deliver``, content header, body) there, and the channel's reader
task, woken on the loop's next turn, takes them out again, assembles the
message and hands it to the consumer.  For a worker that waits for one job
(W3) that hand-over is a loop turn of the pickup, and for a worker draining
a backlog it is three queue puts and gets a message (docs/benchmarks.md,
"Private hooks", has what it costs).

``install`` gives the link's own consumer channel's queue (that one object,
re-classed; aiormq's classes and every other channel are left alone) a
``put_nowait`` that
assembles a delivery itself and calls the consumer at once, in the reader's
turn, when three things hold:

* the queue is empty when the ``Basic.Deliver`` comes, so the channel's
  reader has taken every frame before it: frames are still handled in the
  order they came, and nothing overtakes a ``GetOk``, a ``ConsumeOk`` or a
  ``CancelOk`` queued before it;
* the delivery's consumer is one the link unwrapped (``link._inline_consumer``,
  marked ``mark``): a synchronous callback that only files the message;
* the frames that follow are a content header and its bodies, as the
  protocol has them.  Anything else puts the frames held so far and itself in
  the queue, for the channel's reader to handle (and fail on) as aiormq does.

Everything else goes through the queue untouched.  ``install`` does nothing
on an aiormq whose channel does not look as expected (``ok``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

log = logging.getLogger("dumbwaiter.rabbitmq")

#: the attribute that marks a consumer callback as safe to call from here
MARK = "dw_direct"


def mark(callback: Any) -> Any:
    """Mark ``callback`` (the link's unwrapped consumer) for direct delivery."""
    setattr(callback, MARK, True)
    return callback


class _Frames(asyncio.Queue):  # type: ignore[type-arg]
    """aiormq's channel frame queue, with direct delivery (the module's doc).

    It is the channel's own queue object, re-classed (``install``): the
    channel's reader task may already be waiting on it."""

    _dw_channel: Any
    #: the frames of the delivery being assembled (Deliver, header, bodies)
    _dw_held: list[tuple[int, Any]] | None
    _dw_left: int

    def put_nowait(self, item: tuple[int, Any]) -> None:
        held = self._dw_held
        if held is not None:
            self._more(held, item)
            return
        frame = item[1]
        if type(frame) is spec.Basic.Deliver and self.empty():
            consumer = self._dw_channel.consumers.get(frame.consumer_tag)
            if getattr(consumer, MARK, False):
                self._dw_held = [item]
                return
        super().put_nowait(item)

    def _more(self, held: list[tuple[int, Any]], item: tuple[int, Any]) -> None:
        frame = item[1]
        if len(held) == 1:
            if type(frame) is not ContentHeader:
                self._give_up(item)
                return
            held.append(item)
            self._dw_left = int(frame.body_size)
        elif type(frame) is ContentBody:
            held.append(item)
            self._dw_left -= len(frame.value)
        else:
            self._give_up(item)
            return
        if self._dw_left <= 0:
            self._dw_held = None
            self._hand(held)

    def _give_up(self, item: tuple[int, Any]) -> None:
        """Not a delivery as the protocol has it: everything to the queue."""
        held, self._dw_held = self._dw_held or [], None
        for it in held:
            super().put_nowait(it)
        super().put_nowait(item)

    def _hand(self, held: list[tuple[int, Any]]) -> None:
        deliver, header = held[0][1], held[1][1]
        body = b"".join(f.value for _, f in held[2:]) if len(held) != 3 else held[2][1].value
        ch = self._dw_channel
        consumer = ch.consumers.get(deliver.consumer_tag)
        if consumer is None:  # cancelled meanwhile: aiormq drops it too
            log.warning("rabbitmq: a delivery for consumer %s, gone", deliver.consumer_tag)
            return
        message = DeliveredMessage(delivery=deliver, header=header, body=body, channel=ch)
        try:
            consumer(message)
        except Exception:  # a bug of ours: aiormq logs a consumer's failure too
            log.exception("rabbitmq: the consumer of %s failed", deliver.consumer_tag)


def ok() -> bool:
    """Whether this aiormq's channel reads its frames from an ``asyncio.Queue``
    named ``frames`` and keeps its consumers in ``consumers`` (7.x does)."""
    reader = getattr(aiormq.Channel, "_get_frame", None)
    code = getattr(reader, "__code__", None)
    return code is not None and "frames" in code.co_names


def install(channel: Any) -> bool:
    """Give ``channel``'s frame queue direct delivery; False if it cannot."""
    queue = getattr(channel, "frames", None)
    if type(queue) is not asyncio.Queue or not isinstance(
        getattr(channel, "consumers", None), dict
    ):
        return False
    queue.__class__ = _Frames
    frames = cast(_Frames, queue)
    frames._dw_channel = channel
    frames._dw_held = None
    frames._dw_left = 0
    return True
