"""Pull requests on one durable consumer, and what they delivered.

A JetStream delivery names its subscription (by sid), not the pull request
it answers, and a request cannot be withdrawn: a long-poll request whose
fetch was cancelled stays on the server until it expires and may still be
given a message.  So each consumer gets one inbox subscription per
connection, and everything delivered to it goes to ``stash``: a fetch takes
from the stash first, then asks for more.  Nothing in the stash is leased
(the job's state record is untouched until a claim), and messages nobody
takes within ``GRACE`` seconds are handed back to the server (``-NAK``) for
any worker to take.

Requests end with their batch delivered or with a status message (404 no
messages, 408 expired, 409 ...), and the server serves them in order, so each
delivery or status is counted against the oldest open request (``_Wait``).
That holds within one kind of request only: the server answers a request
for what is there *now* at once even while an older long-poll request
waits.  So the two kinds have an inbox (subscription) each.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from .protocol import (
    Reply,
    Unavailable,
)
from .wire import Wire

#: seconds a delivered message may wait in the stash before it is handed back
GRACE = 0.25
#: seconds a request for what is there now waits when the server sees nothing:
#: a consumer learns of a stored message asynchronously (nats-server 2.9
#: signals its consumers from a goroutine of its own), so a ``no_wait`` pull
#: sent right after a PubAck can be answered "404 No Messages" although the
#: message is stored (docs/benchmarks.md, "Figures behind the NATS engine's
#: choices", has how often).  With ``expires``
#: as well, the server answers at once with what it has, or holds the request
#: that long for the first message when it has none.
SETTLE = 0.1
_NS_PER_S = 1_000_000_000


class Pulled(NamedTuple):
    subject: bytes
    reply: bytes
    hdr: bytes | None
    data: bytes
    at: float


class _Wait:
    __slots__ = ("born", "fut", "got", "want")

    def __init__(self, fut: asyncio.Future[None], want: int) -> None:
        self.fut = fut
        self.want = want
        self.got = 0
        self.born = time.monotonic()

    def done(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)


class Puller:
    def __init__(self, wire: Wire, stream: str, consumer: str) -> None:
        self.wire = wire
        self.stream = stream
        self.consumer = consumer
        self.path = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        self.inbox_now = wire.new_inbox()
        self.inbox_wait = wire.new_inbox()
        self.sids: list[int] = []
        self.stash: deque[Pulled] = deque()
        #: open requests: for what is there now, and long polls
        self.now: deque[_Wait] = deque()
        self.polls: deque[_Wait] = deque()
        #: the server said the consumer is gone (409): make it again
        self.gone = False

    async def start(self) -> None:
        self.sids = [
            await self.wire.subscribe(self.inbox_now.decode(), self._handler(self.now)),
            await self.wire.subscribe(self.inbox_wait.decode(), self._handler(self.polls)),
        ]

    async def stop(self) -> None:
        for sid in self.sids:
            await self.wire.unsubscribe(sid)
        self.sids = []
        self.give_back(0.0)

    @property
    def waits(self) -> bool:
        return bool(self.now or self.polls)

    def _handler(self, waits: deque[_Wait]) -> Callable[[bytes, bytes, bytes | None, bytes], None]:
        def on(subject: bytes, reply: bytes, hdr: bytes | None, data: bytes) -> None:
            if not reply:  # a status message: the oldest open request ended
                code = Reply(hdr, data).status
                if code == 100:  # idle heartbeat
                    return
                if code == 409 and hdr is not None and b"Deleted" in hdr:
                    self.gone = True
                if waits:
                    waits.popleft().done()
                return
            self.stash.append(Pulled(subject, reply, hdr, data, time.monotonic()))
            if waits:
                w = waits[0]
                w.got += 1
                if w.got >= w.want:
                    waits.popleft().done()

        return on

    def take(self, n: int) -> list[Pulled]:
        out: list[Pulled] = []
        stash = self.stash
        while stash and len(out) < n:
            out.append(stash.popleft())
        return out

    def request(
        self, batch: int, expires: float | None = None, settle: float = 0.0
    ) -> asyncio.Future[None]:
        """Ask for up to ``batch`` messages: now only (``expires`` None; with
        ``settle``, waiting that long for a first message when the consumer
        has none, see ``SETTLE``) or waiting up to ``expires`` seconds.  The
        future is done when the request ended (batch delivered or a status)."""
        if expires is None:
            body = b'{"batch":%d,"no_wait":true}' % batch
            if settle > 0:
                body = body[:-1] + b',"expires":%d}' % int(settle * _NS_PER_S)
            inbox, waits = self.inbox_now, self.now
        else:
            body = b'{"batch":%d,"expires":%d}' % (batch, max(int(expires * _NS_PER_S), 1_000_000))
            inbox, waits = self.inbox_wait, self.polls
        self.wire.publish(self.path, body, reply=inbox)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waits.append(_Wait(fut, batch))
        return fut

    async def pull(self, n: int, settle: float = 0.0) -> list[Pulled]:
        """Up to ``n`` messages that are there now: the stash, then one
        request (``settle``: see ``request``)."""
        got = self.take(n)
        if len(got) >= n:
            return got
        fut = self.request(n - len(got), settle=settle)
        await self.wire.flush()
        await fut  # (``expire`` ends it if the server never answers)
        if not self.wire.connected:
            raise Unavailable("the connection to NATS was lost during a pull")
        return got + self.take(n - len(got))

    def give_back(self, older_than: float = GRACE) -> None:
        """``-NAK`` stashed messages nobody took (see the module doc)."""
        if not self.stash:
            return
        limit = time.monotonic() - older_than
        keep: deque[Pulled] = deque()
        for p in self.stash:
            if p.at <= limit:
                try:
                    self.wire.publish(p.reply, b"-NAK")
                except Unavailable:  # redelivered after AckWait instead
                    pass
            else:
                keep.append(p)
        self.stash = keep

    def expire(self, timeout: float) -> None:
        """End requests for what is there now that got no answer in ``timeout``
        s (lost on the way: their fetch returns what the stash has)."""
        limit = time.monotonic() - timeout
        while self.now and self.now[0].born < limit:
            self.now.popleft().done()

    def fail(self) -> None:
        """The connection dropped: the open requests are gone with it."""
        for waits in (self.now, self.polls):
            while waits:
                waits.popleft().done()
