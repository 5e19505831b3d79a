"""A loopback proxy in front of the Kafka cluster that can hold back a
client's first request for the cluster's metadata.

aiokafka's clients bootstrap through the servers the URL names: they
connect, ask for the metadata, and then talk to the brokers the metadata
advertises (tansu's own address), no longer through the proxy.  So every
connection the proxy accepts is one client's bootstrap, and holding its
Metadata request holds that client's ``start()`` at the point where a
cancellation once left the connection open (``brokers/kafka/connection.py``,
``started``).

``hold(n)`` holds the first Metadata request of the ``n``-th connection
from then on; ``asked`` is set when it arrives; ``release()`` lets it (and
every later request) through.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

#: the Kafka protocol's api key of a Metadata request
METADATA = 3


class Stall:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.asked = asyncio.Event()
        self._released = asyncio.Event()
        self._released.set()
        self._hold_at = 0
        self._accepted = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        #: the connections' handlers (each ends once its pumps do)
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def __aenter__(self) -> Stall:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
        assert self._server is not None
        self._server.close()
        for t in self._pumps:
            t.cancel()
        await asyncio.gather(*self._handlers)
        await self._server.wait_closed()

    def hold(self, nth: int) -> None:
        """Hold the first Metadata request of the ``nth`` connection accepted
        from now on (1: the next one)."""
        self._hold_at = self._accepted + nth
        self.asked.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(me)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        held = self._accepted == self._hold_at
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.ensure_future(self._requests(reader, up_w, held)),
            asyncio.ensure_future(_copy(up_r, writer)),
        ]
        self._pumps.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps.difference_update(pumps)
            for w in (writer, up_w):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()

    async def _requests(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, held: bool
    ) -> None:
        """Client to cluster, one request at a time (a size, then the request:
        its api key first)."""
        while True:
            try:
                head = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", head)[0])
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if held and struct.unpack(">h", body[:2])[0] == METADATA:
                held = False
                self.asked.set()
                await self._released.wait()
            up.write(head + body)
            await up.drain()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(65536):
        dst.write(data)
        await dst.drain()
