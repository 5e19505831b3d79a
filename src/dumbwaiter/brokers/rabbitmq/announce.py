"""The vhost's word on which state store an app uses.

Every process of an app (a vhost and a ``prefix``) must keep its job state
in one store: two split the records, locks, limits and unique keys between
them, and nothing fails (issue 20: two hosts on the default SQLite file
each ran every cron tick and every unique job).  So the vhost itself holds
the app's state-store identity (``identity.py``), and RabbitMQ arbitrates:

* ``P.state``, a durable fanout exchange nobody publishes to, is declared
  with the identity as its ``alternate-exchange`` argument.  RabbitMQ
  compares that argument when an exchange is declared again (it ignores
  unknown ``x-`` arguments, so the identity cannot ride in one of those) and
  refuses a different value with PRECONDITION_FAILED.  The first declare
  wins, atomically, across every node of a cluster: of two processes that
  start at once with different stores, exactly one goes on.
* ``P.state``, a queue of one message (``x-max-length`` 1, drop-head), holds
  the identity's description, written by each process that passed: AMQP
  cannot read an exchange's arguments back, and the refused process must
  name the store it lost to.  It reads the message and gives it back.
* Each process that passed binds a queue of its own (exclusive: gone when
  its connection closes) to ``P.state``.  While any is bound, the exchange
  is "in use" and ``forget`` (``dumbwaiter state reset-identity``), a delete
  with ``if-unused``, is refused: the identity cannot be forgotten under a
  running process.

Nothing here needs the management plugin.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec

from ...errors import BrokerError, ConfigurationError, StateStoreConflict
from ..identity import Identity
from .link import AMQP_ERRORS

log = logging.getLogger("dumbwaiter.rabbitmq")

#: the one exchange argument RabbitMQ compares on a second declare
MARK = "alternate-exchange"
#: tries of a claim whose exchange a reset deleted between declare and bind
CLAIM_ROUNDS = 5
#: seconds a refused process waits for the description of the winner (it
#: may be writing it, or another refused process may hold it a moment)
READ_WAIT = 5.0
#: what opening or closing a connection of our own may raise
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*AMQP_ERRORS, OSError)


def name(prefix: str) -> str:
    """The exchange and the queue of ``prefix``'s announcement."""
    return f"{prefix}.state"


def _mark(ident: Identity) -> str:
    return f"dw-state:{ident.key}"


def _queue_args(queue_type: str) -> dict[str, Any]:
    args: dict[str, Any] = {"x-max-length": 1, "x-overflow": "drop-head"}
    if queue_type == "quorum":
        args["x-queue-type"] = "quorum"
    return args


async def claim(
    conn: AbstractConnection, prefix: str, queue_type: str, ours: Identity, where: str
) -> None:
    """Announce ``ours`` as ``prefix``'s state store on ``conn``'s vhost, or
    agree with the same one announced before; raise ``StateStoreConflict``
    naming both when another store was announced.  Marks this connection as
    a live user of it until the connection closes."""
    x = name(prefix)
    for _ in range(CLAIM_ROUNDS):
        ch = await conn.channel()
        try:
            try:
                await ch.exchange_declare(
                    x, exchange_type="fanout", durable=True, arguments={MARK: _mark(ours)}
                )
            except aiormq.exceptions.ChannelPreconditionFailed:
                raise conflict(ours, await announced(conn, prefix), where) from None
            mine = await ch.queue_declare("", exclusive=True)
            try:
                await ch.queue_bind(str(mine.queue), x)
            except aiormq.exceptions.ChannelNotFoundEntity:
                continue  # a reset deleted it just now: announce again
            await _describe(ch, prefix, queue_type, ours)
            return
        finally:
            await _close(ch)
    raise BrokerError(f"rabbitmq: {where}: the state-store announcement kept disappearing")


async def _describe(ch: AbstractChannel, prefix: str, queue_type: str, ours: Identity) -> None:
    """Write ``ours``'s description for refused processes to read (best
    effort: the refusal itself never depends on it)."""
    q = name(prefix)
    try:
        await ch.queue_declare(q, durable=True, arguments=_queue_args(queue_type))
        props = spec.Basic.Properties(delivery_mode=2, content_type="application/json")
        await ch.basic_publish(ours.dump(), routing_key=q, properties=props)
    except AMQP_ERRORS as exc:
        log.warning("rabbitmq: could not describe the state store on %s: %r", q, exc)


async def announced(conn: AbstractConnection, prefix: str) -> Identity | None:
    """The identity announced for ``prefix``, read and given back; None if
    it cannot be read within ``READ_WAIT`` seconds.

    A quorum queue the winner declared a moment ago may not have started
    yet: RabbitMQ answers a ``basic.get`` on it with INTERNAL_ERROR
    ``noproc`` and closes the whole connection.  Reading goes on over a
    connection of its own to the same URL until the deadline."""
    q = name(prefix)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_WAIT
    own: AbstractConnection | None = None
    try:
        while True:
            use = own if own is not None else conn
            try:
                found = await _read(use, q)
            except AMQP_ERRORS:
                found = None
                if not use.is_closed or loop.time() > deadline:
                    return None
                try:
                    own = await aiormq.connect(conn.url)
                except _CONNECT_ERRORS:
                    return None
            if found is not None:
                return Identity.load(found)
            if loop.time() > deadline:
                return None
            # not written yet (its queue may not even exist: the winner of a
            # race declares it after the exchange), or held by another reader
            await asyncio.sleep(0.05)
    finally:
        if own is not None:
            try:
                await own.close()
            except _CONNECT_ERRORS:
                pass


async def _read(conn: AbstractConnection, q: str) -> bytes | None:
    """The one message of ``q``, given back at once; None while there is
    none (or no queue yet)."""
    ch = await conn.channel()
    try:
        try:
            m = await ch.basic_get(q, no_ack=False)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        d = m.delivery
        if not isinstance(d, spec.Basic.GetOk):
            return None
        await ch.basic_reject(int(d.delivery_tag or 0), requeue=True)
        return m.body
    finally:
        await _close(ch)


def conflict(ours: Identity, theirs: Identity | None, where: str) -> StateStoreConflict:
    other = (
        theirs.describe()
        if theirs is not None
        else "another state store (its description could not be read)"
    )
    hint = ""
    if theirs is not None and theirs.store == ours.store:
        hint = (
            " Both name the same URL but not the same store: it was emptied or replaced "
            "since (a new store id), or the URL reaches another server or file from here"
            + (" (a single-host store, on another host)" if not ours.multi_host else "")
            + "."
        )
    return StateStoreConflict(
        f"{where} keeps its job state in {other}, but this process would keep it in "
        f"{ours.describe()}.{hint} Two state stores for one broker namespace split the "
        "jobs' records, locks, limits and unique keys between them, so this process "
        "refuses to start. Fix: give every process of the app the same state= (for "
        "several machines, a PostgreSQL or Redis store every host reaches), or give this "
        "one a prefix= of its own; to move the app to another state store on purpose, "
        "stop every process of it and run `dumbwaiter state reset-identity` "
        "(docs/rabbitmq.md).",
        ours=ours.describe(),
        theirs=None if theirs is None else theirs.describe(),
    )


async def forget(conn: AbstractConnection, prefix: str, where: str) -> bool:
    """Delete ``prefix``'s announcement, unless a live process holds it
    (``ConfigurationError``).  False when there was none."""
    x = name(prefix)
    ch = await conn.channel()
    try:
        try:
            await ch.exchange_declare(x, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
    finally:
        await _close(ch)
    ch = await conn.channel()
    try:
        try:
            await ch.exchange_delete(x, if_unused=True)
        except aiormq.exceptions.ChannelPreconditionFailed:
            raise ConfigurationError(
                f"{where}: processes that use the announced state store are still "
                "running (workers, schedulers, dashboards, producers): stop every one of "
                "them, then reset the identity"
            ) from None
    finally:
        await _close(ch)
    ch = await conn.channel()
    try:
        await ch.queue_delete(name(prefix))
    finally:
        await _close(ch)
    return True


async def _close(ch: AbstractChannel) -> None:
    if not ch.is_closed:
        try:
            await ch.close()
        except AMQP_ERRORS:
            pass
