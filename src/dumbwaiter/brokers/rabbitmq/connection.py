"""The RabbitMQ broker's connections, which every part of it shares.

* One ``AmqpLink`` per event loop (link.py: a connection, a confirming
  publisher channel, a consumer channel and what its consumers were
  handed), through the shared ``PerLoop`` registry (perloop.py): one broker
  object serves a worker's loop, the App's portal thread and a test's
  ``asyncio.run`` at once, and an aiormq connection belongs to one loop.
* On each new connection, before anything is sent on it, the vhost's word
  that this broker's state store is the app's (``_claim``, announce.py);
  until then the store sits behind a gate (coordination.py picks the store).
* The state store's clock (clock.py), which every record's time is on.
* The topology (topology.py names it), declared on first use and
  remembered until the connection drops.
* ``_send``: a publish with confirms, tried again on a new connection while
  RabbitMQ is unreachable.

``RabbitMQConnection`` holds this and the URL's options; ledger.py adds the
jobs' records and copies, the parts of the broker (enqueue.py,
transport.py, outcomes.py, admin.py) are mixins on that, and broker.py
puts them together.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from collections import deque
from typing import Any, ClassVar

import orjson
from pamqp import commands as spec

from ...errors import BrokerConfigError, BrokerError, StateStoreConflict
from ...redact import mask_url
from .. import identity
from ..base import FOUND_DEAD_LIMIT, Broker, StateDelegation
from ..clock import ServerClock
from ..deadline import Backoff
from ..gate import Gate
from ..perloop import PerLoop
from ..record import Record
from ..types import Binding, DeadLetter
from . import announce, coordination
from . import options as o
from . import topology as topo
from .link import AMQP_ERRORS, AmqpLink, failure_of
from .topology import Keys

log = logging.getLogger("dumbwaiter.rabbitmq")

#: what a publish that may be tried again on a new connection can raise
SEND_ERRORS: tuple[type[BaseException], ...] = (BrokerError, *AMQP_ERRORS)


def _abandon(link: AmqpLink) -> None:
    """A loop that closed took the connection's sockets with it: nothing to do."""


class RabbitMQConnection(StateDelegation):
    """The URL's options, the state store and the per-loop connections
    every part of the broker uses (the module's doc)."""

    client_errors: ClassVar[tuple[type[BaseException], ...]] = AMQP_ERRORS

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.amqp_url, opts = o.parse_url(url)
        prefix = opts[o.PREFIX] or o.PREFIX.default
        self.retention = opts[o.RETENTION]
        #: seconds an enqueue keeps trying while RabbitMQ is unreachable
        self.reconnect = opts[o.RECONNECT]
        #: consumer prefetch (0: follows the worker's drain rate)
        self.prefetch = opts[o.PREFETCH]
        self.names = topo.Topology(prefix, opts[o.DELAYS] or o.DELAYS.default, opts[o.QUEUE_TYPE])
        self.exchange_type = opts[o.EXCHANGE_TYPE]
        given = opts[o.STATE]
        #: the directory of the default state store, made on first use
        self._state_dir = None if given else identity.state_dir()
        store, self.state_url = coordination.state_store(url, self.amqp_url, given, prefix)
        #: the companion broker that keeps records and coordination.  Until
        #: the vhost agreed that it is the app's store (``_claim``), ``state``
        #: is a gate in front of it that lets no call through before; then the
        #: store itself (no cost per call), and the gate again on a refusal.
        self._store = store
        #: the state store's clock, which every record's time is on
        self.clock = ServerClock()
        self._gate = Gate(store, self._admit_store)
        self.state: Broker = self._gate
        caps = coordination.with_store(type(self).capabilities, store)
        setattr(self, "capabilities", caps)  # noqa: B010 (a per-instance ClassVar)
        #: this process's identity of the store (``_identity``)
        self._ident: identity.Identity | None = None
        #: link -> the connection generation whose claim passed
        self._claimed: weakref.WeakKeyDictionary[AmqpLink, int] = weakref.WeakKeyDictionary()
        self._claiming: weakref.WeakKeyDictionary[AmqpLink, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self.keys = Keys(prefix)
        self.instance = secrets.token_hex(6)
        name = f"dumbwaiter {prefix} {self.instance}"
        #: one connection per event loop
        self._links: PerLoop[AmqpLink] = PerLoop(
            lambda loop: AmqpLink(self.amqp_url, name, loop), AmqpLink.drop, _abandon
        )
        #: jobs this broker object leased: id -> (token, lease_until)
        self._leases_held: dict[str, tuple[int, float]] = {}
        #: how many leases fetches have added to ``_leases_held``: a write of
        #: the lease map made from an older copy of it (``extend``) sees that
        #: it may have left one out
        self._leases_added = 0
        #: the records of those jobs as this broker last wrote them
        self._leased_records: dict[str, Record] = {}
        #: jobs a fetch dead-lettered (their worker died on the last attempt),
        #: for the next ``rescue`` to report
        self._found_dead: deque[DeadLetter] = deque(maxlen=FOUND_DEAD_LIMIT)
        self._declared: set[str] = set()
        self._cascade = False
        self._bindings: list[Binding] = []
        #: when this process may next try a reconcile (``time.monotonic()``)
        self._reconcile_at = 0.0

    # -- connections -------------------------------------------------------------

    async def _link(self) -> AmqpLink:
        link = self._links.get()
        await self._ensure(link)
        await self._now()
        return link

    async def _now(self) -> float:
        """The state store's time now (``clock.py``), read again when due."""
        if self.clock.due:
            await self.clock.try_sync(self._store_time)
        return self.clock.now()

    def _lease_map(self, now: float) -> bytes:
        """This broker's lease map as the state store keeps it (the rescuer
        reads every worker's: ``_rescue_leases``)."""
        return orjson.dumps({"at": now, "held": self._leases_held})

    async def _store_time(self) -> float:
        """The state store's server clock: the records' lease ends and run
        times live there, written and compared by every host
        (``clock.py``); this host's for a store without one (SQLite)."""
        t = await self._store.server_time()
        return time.time() if t is None else t

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """aiormq's (or a socket's) ``exc`` as the ``BrokerError`` it means
        (``link.failure_of``)."""
        return failure_of(self.amqp_url, exc, waited)

    async def _ensure(self, link: AmqpLink) -> None:
        """Connect ``link`` if need be; on each new connection, claim the
        vhost's word that our state store is the app's before anything is
        sent on it (``announce.py``)."""
        await link.ensure()
        if self._claimed.get(link) != link.gen:
            await self._claim(link)

    async def _claim(self, link: AmqpLink) -> None:
        lock = self._claiming.setdefault(link, asyncio.Lock())
        async with lock:
            gen = link.gen
            if self._claimed.get(link) == gen or link.conn is None:
                return
            ours = await self._identity()
            n = self.names
            try:
                await announce.claim(link.conn, n.prefix, n.queue_type, ours, self._where)
            except StateStoreConflict:
                self._gate.shut()  # the state store is not ours to use any more
                self.state = self._gate
                raise
            except AMQP_ERRORS as exc:
                raise await self._failed(link, "announce the state store", exc) from exc
            self._claimed[link] = gen
            self.state = self._store

    @property
    def _where(self) -> str:
        return f"the RabbitMQ app {mask_url(self.amqp_url)} prefix {self.names.prefix!r}"

    async def _identity(self) -> identity.Identity:
        """The state store's identity (its store id written on first use)."""
        if self._ident is None:
            if self._state_dir is not None:
                coordination.make_state_dir(self._state_dir, self._store.url)
            self._ident = await identity.identity_of(self._store)
        return self._ident

    async def _admit_store(self) -> None:
        """The gate's check: the vhost agreed on this connection."""
        await self._link()

    async def forget_state_identity(self) -> bool:
        link = self._links.get()
        await link.ensure()  # no claim: this process must not hold the announcement
        if link.conn is None:
            raise BrokerError("rabbitmq: the connection is closed")
        try:
            return await announce.forget(link.conn, self.names.prefix, self._where)
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "forget the state store", exc) from exc

    async def _failed(
        self, link: AmqpLink, what: str, exc: BaseException, waited: float | None = None
    ) -> BrokerError:
        """A call failed on the connection: drop it (the next call reconnects)."""
        log.warning("rabbitmq %s failed: %r; reconnecting on the next call", what, exc)
        await link.drop()
        self._declared.clear()
        self._cascade = False
        return self.failure(exc, waited)

    async def open(self) -> None:
        await self.state.open()
        await self._link()

    async def close(self) -> None:
        """Close every loop's connection and wait until each has closed
        (``PerLoop.close``, bounded): a loop that stops right after (the
        portal's, a test's) must not hold aiormq's tasks still pending."""
        await self._links.close()
        await self.state.close()

    # -- topology ------------------------------------------------------------------

    async def _declare_queue(self, link: AmqpLink, queue: str) -> None:
        """The main lane of ``queue`` (priority lanes: ``_declare_lane``; the
        DLQ: ``_declare_dlq``, when the first job dies)."""
        if queue in self._declared:
            return
        await self._ensure_cascade(link)
        await self._declare_lane(link, queue, topo.MAIN)
        await self.state.kv_set({self.keys.queue + queue: b"1"})
        self._declared.add(queue)

    async def _declare_dlq(self, link: AmqpLink, queue: str) -> None:
        """The dead-letter exchange and ``queue``'s DLQ.  Made on first use:
        every quorum queue holds file handles of the server's (a few hundred
        fit in RabbitMQ's default limit), and most queues never see a dead
        letter.  Nothing dead-letters natively before: dumbwaiter never
        rejects, and its lanes have no length or delivery limit."""
        name = self.names.dlq(queue)
        if name in self._declared:
            return
        ch = link.channel()
        await ch.exchange_declare(self.names.dlx, exchange_type="direct", durable=True)
        await ch.queue_declare(name, durable=True, arguments=self._queue_args())
        await ch.queue_bind(name, self.names.dlx, routing_key=queue)
        await self.state.kv_set({self.keys.dlq + queue: b"1"})
        self._declared.add(name)

    def _queue_args(self, dead_letter_to: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.names.queue_type == "quorum":
            args["x-queue-type"] = "quorum"
        if dead_letter_to is not None:
            args["x-dead-letter-exchange"] = self.names.dlx
            args["x-dead-letter-routing-key"] = dead_letter_to
        return args

    async def _declare_lane(self, link: AmqpLink, queue: str, lane: str) -> None:
        """One lane of ``queue``, bound to the cascade's exit.  The priority
        lanes are made when the first job of that priority comes, and are
        recorded in the state store so that every fetcher reads them."""
        name = self.names.lane(queue, lane)
        if name in self._declared:
            return
        ch = link.channel()
        await ch.queue_declare(name, durable=True, arguments=self._queue_args(queue))
        await ch.queue_bind(name, self.names.level(-1), routing_key=topo.exit_pattern(name))
        if lane != topo.MAIN:
            await self.state.kv_set({f"{self.keys.lane}{queue}\x1f{lane}": b"1"})
        self._declared.add(name)

    async def _ensure_cascade(self, link: AmqpLink) -> None:
        """Declare the delay cascade (idempotent; shared by the vhost)."""
        if self._cascade:
            return
        ch = link.channel()
        n = self.names
        await ch.exchange_declare(n.level(-1), exchange_type="topic", durable=True)
        for lvl in range(topo.LEVELS):
            await ch.exchange_declare(n.level(lvl), exchange_type="topic", durable=True)
            await ch.queue_declare(
                n.level_queue(lvl),
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-message-ttl": round(topo.UNIT * 1000 * 2**lvl),
                    "x-dead-letter-exchange": n.level(lvl - 1),
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            )
            await ch.queue_bind(
                n.level_queue(lvl), n.level(lvl), routing_key=topo.level_pattern(lvl, "1")
            )
            await ch.exchange_bind(
                destination=n.level(lvl - 1),
                source=n.level(lvl),
                routing_key=topo.level_pattern(lvl, "0"),
            )
        self._cascade = True

    async def _events_exchange(self, link: AmqpLink, event_type: str = "") -> str:
        n = self.names
        name = n.events if self.exchange_type != "fanout" else f"{n.events}.{event_type}"
        if name not in self._declared:
            await link.channel().exchange_declare(
                name, exchange_type=self.exchange_type, durable=True
            )
            self._declared.add(name)
        return name

    async def _send(
        self, items: list[tuple[str, str, bytes, spec.Basic.Properties]], persist: bool = False
    ) -> None:
        """Publish with confirms; with ``persist``, again on a new connection
        while RabbitMQ is unreachable, for up to ``reconnect`` seconds (a copy
        sent twice is harmless: the ledger runs a job once per version)."""
        if not items:
            return
        # without ``persist``, one try (a worker's send: its loops try again)
        backoff = Backoff(self.reconnect) if persist else None
        while True:
            link = self._links.get()
            try:
                await self._ensure(link)
                if any(ex.startswith(self.names.delays) for ex, *_ in items):
                    await self._ensure_cascade(link)
                for ex, rk in {(ex, rk) for ex, rk, *_ in items}:
                    target = self._target_of(ex, rk)
                    if target is not None:
                        await self._declare_queue(link, target[0])
                        await self._declare_lane(link, *target)
                    elif ex == self.names.dlx:
                        await self._declare_dlq(link, rk)
                await link.publish(items)
                # the next copy to one of these lanes needs no declare
                link.targets.update((ex, rk) for ex, rk, *_ in items if ex == "")
                return
            except SEND_ERRORS as exc:
                err = await self._failed(link, "publish", exc)
                pause = None
                if backoff is not None and not isinstance(err, BrokerConfigError):
                    pause = backoff.pause()  # a refused login or vhost: never again
                if pause is None:
                    if backoff is not None:
                        err = self.failure(err, backoff.waited)
                    client = exc.__cause__ if isinstance(exc, BrokerError) else None
                    raise err from (client or exc)
                await asyncio.sleep(pause)

    def _target_of(self, exchange: str, routing_key: str) -> tuple[str, str] | None:
        """(queue, lane) a copy is for: sent to a lane by name, or through the
        cascade with the lane's name after the delay bits."""
        if exchange == "":
            lane_queue = routing_key
        elif exchange == self.names.level(topo.LEVELS - 1):
            lane_queue = routing_key.split(".", topo.LEVELS)[-1]
        else:
            return None
        for lane in topo.LANES:
            head = f"{self.names.prefix}.{lane}."
            if lane_queue.startswith(head):
                return lane_queue[len(head) :], lane
        return None
