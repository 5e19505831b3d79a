"""The Kafka clients of one event loop (``perloop.PerLoop`` keeps one
``Link`` per loop): a producer, an admin client, the consumers a fetch
reads through (one per consumer group) and the delay relay.

aiokafka's clients start with an await, and ``PerLoop`` makes a client
without one, so a ``Link`` is made empty and starts each client on first
use, under a lock.

A loop that ends without the broker being closed (``asyncio.run`` of a
sync caller's drain) would leave the clients' sockets open on a closed
loop.  So a ``Link`` that started a client keeps an async generator
suspended on its loop (``arm``): ``asyncio.run`` closes a loop's async
generators before it closes the loop, and this one closes the clients.

Every aiokafka client of the package starts through ``started``, so that a
start cut short (a failure, a cancelled caller) leaves no connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any, TypeAlias, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

log = logging.getLogger("dumbwaiter.kafka")

T = TypeVar("T")

#: an aiokafka client we start and stop
_Started = Any


class Link:
    """One event loop's clients (see the module docstring)."""

    def __init__(self, config: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self._lock = asyncio.Lock()
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        #: consumer groups' readers (``transport.Reader``), by group id
        self.readers: dict[str, Any] = {}
        #: the delay relay of this loop (``delay.Relay``), once a fetch started it
        self.relay: Any = None
        #: job id -> the reader whose copy it was leased from, until settled
        self.held: dict[str, Any] = {}
        #: one fetch at a time reads through this loop's consumers (two
        #: workers of one app share them: a consumer reads for one caller)
        self.fetching = asyncio.Lock()
        #: the paused queues among those a fetch asked for, as last read
        #: (queue -> paused), and when (monotonic): see ``KafkaBroker._paused``
        self.paused: dict[str, bool] = {}
        self.paused_at = 0.0
        self.closed = False
        self._keeper: AsyncGenerator[None, None] | None = None

    async def arm(self) -> None:
        """Close the clients when the loop's async generators are shut down."""
        if self._keeper is None:
            self._keeper = _keep(self)
            await self._keeper.__anext__()

    async def producer(self, max_request_size: int) -> AIOKafkaProducer:
        if self._producer is None:
            await self.arm()
            async with self._lock:
                if self._producer is None:
                    p = AIOKafkaProducer(
                        **self.config,
                        acks="all",
                        linger_ms=0,
                        enable_idempotence=False,
                        max_request_size=max_request_size,
                    )
                    await started(p)
                    self._producer = p
        return self._producer

    async def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            await self.arm()
            async with self._lock:
                if self._admin is None:
                    conf = {k: v for k, v in self.config.items() if k in _ADMIN_KEYS}
                    a = AIOKafkaAdminClient(**conf)
                    await started(a)
                    self._admin = a
        return self._admin

    async def create_topics(self, topics: Iterable[tuple[str, int, int, dict[str, str]]]) -> None:
        """Create topics (name, partitions, replication, configs) that are missing."""
        new = [NewTopic(n, p, r, topic_configs=c) for n, p, r, c in topics]
        if not new:
            return
        admin = await self.admin()
        try:
            resp = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return
        for err in getattr(resp, "topic_errors", ()):
            name, code = err[0], err[1]
            if code not in (0, TopicAlreadyExistsError.errno):
                from aiokafka.errors import for_code

                raise for_code(code)(f"create topic {name}: {err[2] if len(err) > 2 else ''}")

    async def close(self) -> None:
        """Close the clients; a caller cancelled meanwhile does not cut the
        close short (``unhurried``): a producer stopped halfway left the
        connection its sender was opening for a write in flight."""
        if self.closed:
            return
        self.closed = True
        await unhurried(self._close(), CLOSE_GRACE)

    async def _close(self) -> None:
        # Readers (and the relay, which sends through the producer) first,
        # then the producer and the admin client; each group at once, so a
        # consumer slow to leave its group (a loaded machine) does not use up
        # an ending loop's time (``KEEPER_CLOSE``) before the rest were even
        # asked to close, leaving their sockets to be collected unclosed.
        first: list[Callable[[], Awaitable[None]]] = []
        if self.relay is not None:
            first.append(self.relay.stop)
        first += [r.stop for r in self.readers.values()]
        then: list[Callable[[], Awaitable[None]]] = []
        if self._producer is not None:
            then.append(self._producer.stop)
        if self._admin is not None:
            then.append(self._admin.close)
        self.relay, self.readers, self._producer, self._admin = None, {}, None, None
        for group in (first, then):
            results = await asyncio.gather(*(stop() for stop in group), return_exceptions=True)
            for exc in results:
                if isinstance(exc, Exception):  # closing: nothing more to do with it
                    log.debug("kafka: closing a client failed: %r", exc)
                elif isinstance(exc, BaseException):
                    raise exc
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.aclose()


#: an aiokafka client: a producer, a consumer or an admin client
Client: TypeAlias = AIOKafkaProducer | AIOKafkaConsumer | AIOKafkaAdminClient


async def started(client: Client) -> None:
    """Start ``client`` so that a start that does not end well leaves
    nothing open: if it fails, or the caller is cancelled meanwhile, the
    client is closed before the error (or the cancellation) goes on.

    aiokafka's bootstrap keeps its first connection in a local variable
    while it asks that server for the cluster's metadata, and only then
    hands it to the client (or closes it).  A cancellation there (a
    worker's stop interrupts its idle fetch, which may be starting the
    admin client or a consumer; a ``wait_for`` runs out) dropped the
    connection where the client's own close cannot reach it: the socket was
    collected unclosed.  So the start is ``unhurried``: a cancelled caller
    waits for it to end (``START_GRACE`` at most: a start stuck on a server
    that does not answer is cut short then), closes the client and is
    cancelled then.  (A loop that ends with a start going, its broker not
    closed, cancels the start's own task too: ``asyncio.run`` cancels every
    task.)"""
    try:
        await unhurried(client.start(), START_GRACE)
    except BaseException:
        with contextlib.suppress(Exception):
            await stopped(client)
        raise


async def stopped(client: Client) -> None:
    """Stop ``client``; a caller cancelled meanwhile does not cut it short
    (``unhurried``, ``CLOSE_GRACE``)."""
    close = client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop()
    await unhurried(close, CLOSE_GRACE)


async def unhurried(aw: Awaitable[T], grace: float) -> T:
    """Await ``aw`` in a task of its own that a cancelled caller does not
    cut short: the caller waits for it to end (``grace`` seconds at most;
    then it is cancelled too) and is cancelled then.  For the starts and
    closes of clients, which leave sockets open when cut short halfway."""
    task = asyncio.ensure_future(aw)
    task.add_done_callback(_seen)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            try:
                await asyncio.wait([task], timeout=grace)
            finally:
                task.cancel()  # (nothing, when it has ended)
        raise


def _seen(task: asyncio.Future[Any]) -> None:
    """Read a task's outcome: its failure is the caller's to report (or
    the caller was cancelled), not the loop's "never retrieved"."""
    if not task.cancelled():
        task.exception()


#: seconds a caller cancelled during a client's start waits for the start
#: to end (``started``): a bootstrap is a connect and two requests to one
#: server, so a start still going then waits on a server that does not answer
START_GRACE = 5.0
#: seconds a caller cancelled during a close waits for it to end
#: (``Link.close``, ``stopped``): a consumer leaving its group, a producer
#: delivering what it was sending
CLOSE_GRACE = 5.0


async def _keep(link: Link) -> AsyncGenerator[None, None]:
    """Suspended on the link's loop until the loop shuts its async
    generators down (or the link closes): then it closes the link."""
    try:
        yield
    finally:
        link._keeper = None
        # bounded: the loop's tasks (aiokafka's own among them) may have been
        # cancelled already, and a client waiting on one of them would wait
        # for ever; the loop closes after this either way
        try:
            await asyncio.wait_for(link.close(), KEEPER_CLOSE)
        except TimeoutError:
            log.debug("kafka: clients of an ending loop did not close in time")


#: seconds an ending loop gives its clients to close (``_keep``; then
#: ``CLOSE_GRACE`` more: ``Link.close`` is unhurried)
KEEPER_CLOSE = 10.0

#: the settings an admin client accepts (it takes no producer or consumer ones)
_ADMIN_KEYS = frozenset(
    {
        "bootstrap_servers",
        "client_id",
        "request_timeout_ms",
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
    }
)


def abandon(link: Link) -> None:
    """Let go of a link whose loop has closed.  Its keeper (``_keep``) closed
    the clients as the loop shut down; one that did not close within
    ``KEEPER_CLOSE`` keeps its sockets until they are collected: without a
    running loop nothing can close them cleanly."""
    link.readers, link.relay = {}, None
