"""What every part of the NATS broker shares: connections per event loop,
the server's clock, configuration entries and the kv and holder reads.

``NatsBroker`` (broker.py) is ``Enqueue`` (enqueue.py) + ``Transport``
(transport.py, over ``Claim`` in claim.py) + ``Rescue`` (rescue.py) +
``Admin`` (admin.py) + ``Coordination`` (coordination.py), over ``Moves``
(moves.py: a job's pointer published, removed, a job given back or buried),
``Index`` (index.py: finding a job) and this ``Core``; docs/nats.md
describes the layout they share (names.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import orjson

from ...errors import (
    BrokerAuthError,
    BrokerError,
    BrokerUnavailable,
)
from .. import failure
from ..base import FOUND_DEAD_LIMIT, Broker
from ..clock import ServerClock
from ..perloop import PerLoop
from ..types import DeadLetter
from .connection import LoopLink
from .names import Settings, Subjects, key_tokens, parse_url, tok
from .pointers import live
from .protocol import (
    Reply,
    refused_login,
)
from .puller import Pulled
from .store import Stored

#: the longest a delay entry is held in one go (entries are looked at again)
MAX_HOLD = 3600.0
#: seconds between kv expiry sweeps (under the maintenance lock)
SWEEP_EVERY = 15.0

Hdrs = tuple[tuple[bytes, bytes | str | int | float], ...]


def _abandon(link: LoopLink) -> None:
    """Let go of a connection whose event loop has closed (``PerLoop``)."""
    link.wire.abandon()


def _client_errors() -> tuple[type[BaseException], ...]:
    """nats-py's exceptions (when it is installed: without it, ``App()``
    already failed) and the socket's."""
    try:
        from nats.errors import Error
    except ImportError:
        return (OSError, asyncio.TimeoutError)
    return (Error, OSError, asyncio.TimeoutError)


class Core(Broker):
    """Connections and the reads every part shares (see the module doc)."""

    client_errors = _client_errors()

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """nats-py's (or the wire's) ``exc`` as the ``BrokerError`` it means:
        refused credentials (for good), a server out of reach (for now; an
        ``Unavailable`` is worded again with the time waited), or anything
        else."""
        if isinstance(exc, BrokerError):  # the wire's: worded again, naming the server
            if exc.server is not None and waited is None:
                return exc
            cause = exc.__cause__ or exc
            if isinstance(exc, BrokerAuthError):
                return failure.refused(self.url, cause, auth=True)
            if isinstance(exc, BrokerUnavailable):
                return failure.unavailable(self.url, cause, waited)
            return exc
        if refused_login(exc):
            return failure.refused(self.url, exc, auth=True)
        if isinstance(exc, OSError | asyncio.TimeoutError) or "connection" in str(exc).lower():
            return failure.unavailable(self.url, exc, waited)
        return failure.failed(self.url, exc, "nats")

    async def _promote(self, link: LoopLink, items: list[Pulled]) -> None:
        """Move due delay entries to the work subjects (the transport's part)."""
        raise NotImplementedError

    async def _reconcile_own(self, link: LoopLink, every: bool = False) -> None:
        """Tidy a connection's holder list (moves.py's part)."""
        raise NotImplementedError

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.settings: Settings = parse_url(url)
        self.n = Subjects(self.settings)
        self.retention = self.settings.retention
        #: the server's clock (the time stamp JetStream gives a write), which
        #: every lease, lock and run time written here is on (``clock.py``)
        self.clock = ServerClock()
        #: each event loop's connection (``brokers/perloop.py``)
        self._links: PerLoop[LoopLink] = PerLoop(
            lambda loop: LoopLink(self, loop), LoopLink.stop, _abandon
        )
        #: jobs this process dead-lettered for a lost lease (at a claim or a
        #: rescue), for the next ``rescue`` to report
        self._found_dead: deque[DeadLetter] = deque(maxlen=FOUND_DEAD_LIMIT)
        #: the event bindings table as this process last read it, with the
        #: sequence it was stored at (``Enqueue.publish``); None: read it first
        self._bindings: tuple[int, dict[str, dict[str, int]]] | None = None

    def __repr__(self) -> str:
        return f"<NatsBroker {self.n.ns}>"

    async def _link(self) -> LoopLink:
        link = self._links.get()
        if not link.ready:
            try:
                await link.start()
            except BrokerError as exc:  # unreachable, or the login refused
                raise self.failure(exc) from (exc.__cause__ or exc)
        if self.clock.due:
            await self.clock.try_sync(lambda: self._server_time(link))
        return link

    async def server_time(self) -> float | None:
        return await self._server_time(await self._link())

    async def _server_time(self, link: LoopLink) -> float:
        """The server's time: the time stamp of a write of this process's
        own, read back (so it falls between sending the write and the read's
        answer), then deleted: the bucket keeps only what users and the
        broker stored."""
        subject = self.n.c + b"clock." + tok(link.holder.id)
        ack = await link.store.put(subject, b"", None)
        cur = await link.store.read(self.n.kv, subject)
        await link.store.delete(self.n.kv, ack.seq)
        if cur is None or not cur.time:
            raise BrokerError(f"nats: {subject.decode()} has no time stamp")
        return cur.time

    async def open(self) -> None:
        await self._link()

    async def close(self) -> None:
        await self._links.close()

    async def _merge_config(self, link: LoopLink, name: bytes, fn: Any) -> Any:
        out: dict[str, Any] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs] | None:
            old = orjson.loads(cur.data) if cur is not None and cur.data else None
            new = fn(old)
            out["v"] = new
            if new == old:
                return None
            return orjson.dumps(new), ()

        await link.store.cas(self.n.kv, self.n.c + name, change)
        return out.get("v")

    async def _config(self, link: LoopLink, name: bytes) -> Any:
        cur = await link.store.read(self.n.kv, self.n.c + name)
        return orjson.loads(cur.data) if cur is not None and cur.data else None

    def _kv_subject(self, key: str) -> bytes:
        return self.n.k + key_tokens(key)

    async def _kv_read(self, link: LoopLink, subject: bytes) -> bytes | None:
        cur = await link.store.read(self.n.kv, subject)
        return live(cur, self.clock.now())

    async def _holders(self, link: LoopLink) -> list[tuple[str, Stored, dict[str, Any]]]:
        subjects = await link.store.subjects(self.n.hold, self.n.h + b"*")
        names = sorted(subjects)
        out = []
        for subject, cur in zip(names, await link.store.read_many(self.n.hold, names), strict=True):
            if cur is not None and cur.data:
                out.append((subject[len(self.n.h) :].decode(), cur, orjson.loads(cur.data)))
        return out

    @staticmethod
    async def _await(link: LoopLink, fut: asyncio.Future[Reply]) -> Reply:
        await link.wire.flush()
        return await fut
