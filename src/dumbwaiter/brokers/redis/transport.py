"""The job's path on Redis: enqueue, fetch, settle, rescue (the seam's transport).

Every state transition is one Lua script (``scripts/*.lua``), so each is
atomic on the server and costs one round trip however many jobs it moves:
a worker claims a batch, acks a batch, extends every lease it holds, in one
call each.

Idle workers block on the server: an idle fetch registers as a waiter of
its queues and waits in ``BLPOP`` on an inbox of its own (until the earliest
scheduled job is due, at most ``wait``).  The enqueue script hands ready jobs
straight into a waiter's inbox, already leased to it, so a job starts one
hop after its enqueue; other transitions that make jobs ready leave a
wake-up there instead.  Sync producers (``enqueue_sync``) use blocking
sockets of their own thread: no event loop, no thread hop.  Enqueue itself
(chunking, staging of big batches, retries) is in ``bulk.py``, events in
``events.py``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from redis.exceptions import RedisError

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message
from ...message import from_dict as message_from_dict
from ..base import Broker
from ..finished import compacts
from ..types import Binding, DeadLetter, Delivery, Rescued
from . import bulk, events
from .bulk import drive, run_sync
from .connection import TRANSIENT, Arg, Connection
from .lua import Scripts

log = logging.getLogger("dumbwaiter.redis")

#: jobs moved or deleted per rescue call, and per call of a replay or purge
HOUSEKEEPING_CHUNK = 1000
#: seconds an idle fetch stays registered as a waiter before it registers again
WAITER_TTL = 1.0


class Transport(Broker):
    """The seam's transport methods on Redis (mixed into ``RedisBroker``)."""

    conn: Connection
    lua: Scripts
    #: seconds finished jobs (without a longer-kept result) stay visible
    retention: float

    async def open(self) -> None:
        self.conn.links.get()

    async def close(self) -> None:
        await self.conn.close()

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        if queues or bindings:
            args: list[Arg] = [len(queues), *queues]
            for b in bindings:
                args += (b.pattern, b.queue, b.max_attempts)
            await self.conn.run(self.lua.declare, args)

    # -- events (events.py, scripts/_events.lua) --------------------------------

    async def publish(self, msgs: Iterable[Message]) -> int:
        conn = self.conn
        await conn.read_clock()
        plan = events.publish(conn, events.chunks(msgs, self.max_message_size))
        return await drive(conn.links.get(), plan)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        conn = self.conn
        conn.read_clock_sync()
        plan = events.publish(conn, events.chunks(msgs, self.max_message_size))
        return run_sync(drive(conn.sync, plan))

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        args = events.list_args(event_type, since, until, cursor, limit)
        return events.parse_page(await self.conn.run(self.lua.list_events, args))

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        conn = self.conn
        await conn.read_clock()
        one = bulk.single(conn, msgs, self.max_message_size)
        if one is None:
            plan = bulk.Enqueue(conn, msgs, self.max_message_size).plan()
            return await drive(conn.links.get(), plan)
        m, script, args = one  # one script call, no plan to drive
        try:
            reply = await conn.links.get().script(script, conn.keys.scripts, args)
        except TRANSIENT as exc:
            plan = bulk.Enqueue(conn, [m], self.max_message_size).after_failure(exc)
            return await drive(conn.links.get(), plan)
        except RedisError as exc:
            raise conn.failure(exc, "enqueue") from exc
        return bulk.ids_of(reply, [m.id])

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        conn = self.conn
        conn.read_clock_sync()
        one = bulk.single(conn, msgs, self.max_message_size)
        if one is None:
            plan = bulk.Enqueue(conn, msgs, self.max_message_size).plan()
            return run_sync(drive(conn.sync, plan))
        m, script, args = one
        try:
            reply = conn.sync.script(script, conn.keys.scripts, args)
        except TRANSIENT as exc:
            plan = bulk.Enqueue(conn, [m], self.max_message_size).after_failure(exc)
            return run_sync(drive(conn.sync, plan))
        except RedisError as exc:
            raise conn.failure(exc, "enqueue") from exc
        return bulk.ids_of(reply, [m.id])

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0 or not queues:
            return []
        if wait <= 0:
            once = asyncio.ensure_future(self._claim(queues, limit, lease, worker, "", None))
            try:
                return (await asyncio.shield(once))[0]
            except asyncio.CancelledError:
                await asyncio.shield(self._give_back(once, queues, ""))
                raise
        return await self.wait_fetch(queues, limit, lease, wait, worker, secrets.token_hex(8))

    async def wait_fetch(
        self,
        queues: Sequence[str],
        limit: int,
        lease: float,
        wait: float,
        worker: str,
        wid: str,
        stop: asyncio.Event | None = None,
    ) -> list[Delivery]:
        """``fetch`` that waits, as waiter ``wid``.  With ``stop``: once it is
        set and a wake-up is in the inbox (``wake``), the wait ends at once,
        withdrawn, returning what was handed to it meanwhile (maybe nothing):
        how a fetch over several keyspaces ends the waits it no longer needs
        without cutting a ``BLPOP`` whose reply may hold a job."""
        # Nothing ready: register as a waiter of the queues and wait in BLPOP
        # on our own inbox.  An enqueue hands ready jobs straight into it,
        # already leased to us (no second round trip); other changes (a
        # retry, a rescue, a resume) leave a wake-up there and we claim.  The
        # registration lapses after WAITER_TTL, so a worker that died while
        # waiting is soon skipped: each round registers again.
        inbox = self.conn.keys.inbox(wid)
        deadline = time.monotonic() + wait
        claim: asyncio.Future[tuple[list[Delivery], float | None]] | None = None
        try:
            while True:
                if stop is not None and stop.is_set():
                    return (await self._claim(queues, 0, 0.0, "", wid, None))[0]
                remaining = deadline - time.monotonic()
                now = await self.conn.now()
                until = now + min(remaining, WAITER_TTL) + 0.5 if remaining > 0 else None
                claim = asyncio.ensure_future(self._claim(queues, limit, lease, worker, wid, until))
                out, next_due = await asyncio.shield(claim)
                claim = None
                if out or until is None:
                    return out
                block = min(remaining, WAITER_TTL)
                if next_due is not None:
                    block = min(block, next_due - (await self.conn.now()))
                if block <= 0:
                    continue
                # BLPOP's timeout 0 means "for ever": never round down to it
                try:
                    item = await self.conn.links.get().call(
                        b"BLPOP",
                        inbox,
                        f"{max(block, 0.001):.3f}",
                        timeout=block + self.conn.target.read_timeout,
                    )
                except RedisError as exc:
                    raise self.conn.failure(exc, "fetch") from exc
                if item is not None and item[1] != b"w":
                    return _handed(item[1])
        except BaseException:
            # cancelled (the worker stops) or the server went away: withdraw
            # the registration, and give back what was handed to us meanwhile
            await asyncio.shield(self._give_back(claim, queues, wid))
            raise

    async def _give_back(
        self,
        claim: asyncio.Future[tuple[list[Delivery], float | None]] | None,
        queues: Sequence[str],
        wid: str,
    ) -> None:
        """After a fetch was cancelled: withdraw its waiter and give back,
        uncharged, whatever it was handed or had claimed meanwhile."""
        ds: list[Delivery] = []
        try:
            if claim is not None:
                ds += (await claim)[0]
            if wid:
                ds += (await self._claim(queues, 0, 0.0, "", wid, None))[0]
            await self.requeue(ds)
        except Exception as exc:
            # the server is gone: these leases run out and the rescuer gives
            # the jobs back (uncharged, if they never left the inbox)
            if ds:
                log.warning("could not give back %d job(s) of a fetch: %s", len(ds), exc)

    async def wake(self, wid: str) -> None:
        """Leave a wake-up in waiter ``wid``'s inbox (see ``wait_fetch``); it
        expires if the waiter is already gone."""
        inbox = self.conn.keys.inbox(wid)
        try:
            link = self.conn.links.get()
            await link.call(b"RPUSH", inbox, b"w")
            await link.call(b"EXPIRE", inbox, int(WAITER_TTL) + 60)
        except RedisError as exc:
            raise self.conn.failure(exc, "fetch") from exc

    async def _claim(
        self,
        queues: Sequence[str],
        limit: int,
        lease: float,
        worker: str,
        wid: str,
        register_until: float | None,
    ) -> tuple[list[Delivery], float | None]:
        """One fetch script call: the waiter's inbox, then ready jobs."""
        now = await self.conn.now()
        args: list[Arg] = [
            repr(now),
            limit,
            repr(lease),
            worker,
            wid,
            "" if register_until is None else repr(register_until),
            *queues,
        ]
        r = await self.conn.run(self.lua.fetch, args)
        token = int(r[0])
        n_items = int(r[2])
        out: list[Delivery] = []
        for item in r[3 : 3 + n_items]:
            if item != b"w":
                out += _handed(item)
        first = 3 + n_items
        if len(r) > first:
            until = now + lease
            out += [_delivery(r, i, token, until) for i in range(first, len(r), 5)]
        if out:
            return out, None
        return out, float(r[1]) if r[1] else None

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        now = await self.conn.now()
        retention = self.retention
        # what most jobs of a batch share, worked out once: their expiry and
        # the server clock's offset (a compact record's start is the server's)
        expires = repr(now + retention)
        offset = self.conn.clock.offset()
        args: list[Arg] = [repr(now)]
        for d in ds:
            ttl = d.result_ttl
            args += (
                d.id,
                d.token,
                repr(now + max(retention, ttl)) if ttl and d.result is not None else expires,
                d.result if d.result is not None else b"",
                (repr(d.started_at + offset) if d.started_at else repr(now))
                if compacts(d)
                else b"",
            )
        await self.conn.run(self.lua.ack, args)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self.conn.now())]
        for d in ds:
            err, etype = _error(d.error)
            args += (d.id, d.token, repr(self.conn.clock.to_server(d.retry_at)), err, etype)
        await self.conn.run(self.lua.retry, args)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self.conn.now())]
        for d in ds:
            err, etype = _error(d.error)
            args += (d.id, d.token, err, etype)
        await self.conn.run(self.lua.dead, args)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        args: list[Arg] = [repr(await self.conn.now())]
        for d in ds:
            args += (d.id, d.token, repr(self.conn.clock.to_server(d.retry_at)))
        await self.conn.run(self.lua.requeue, args)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        until = (await self.conn.now()) + lease
        args: list[Arg] = [repr(until)]
        for d in ds:
            args += (d.id, d.token)
        lost_at = {int(i) for i in await self.conn.run(self.lua.extend, args)}
        lost = []
        for i, d in enumerate(ds, 1):
            if i in lost_at:
                lost.append(d)
            else:
                d.lease_until = until
        return lost

    async def rescue(self) -> Rescued:
        # Each call handles at most HOUSEKEEPING_CHUNK expired leases and as
        # many finished jobs past their retention, so the server is never held
        # for long; a busy app (more jobs finishing per second than one call
        # prunes) gets as many calls as it needs, for up to half a second.
        rescued = 0
        dead: list[DeadLetter] = []
        stop = time.monotonic() + 0.5
        while True:
            now = await self.conn.now()
            args: list[Arg] = [
                repr(now),
                HOUSEKEEPING_CHUNK,
                repr(now - self.event_retention),
                repr(self.retention),
            ]
            n, more, buried = await self.conn.run(self.lua.rescue, args)
            rescued += int(n)
            # id, queue, name, error record (JSON), attempt, body, errors (JSON)
            for i in range(0, len(buried), 7):
                id_, queue, name, err, attempt, body, errors = buried[i : i + 7]
                error = ErrorRecord.from_dict(orjson.loads(err))
                try:
                    msg: Message | None = message(body, queue.decode(), int(attempt), errors)
                except (orjson.JSONDecodeError, MessageDecodeError):
                    msg = None
                dead.append(DeadLetter(id_.decode(), queue.decode(), name.decode(), error, msg))
            if not more or time.monotonic() > stop:
                return Rescued(rescued, dead)


# -- replies -------------------------------------------------------------------


def _error(e: ErrorRecord | None) -> tuple[bytes, str]:
    if e is None:
        return b"", ""
    return orjson.dumps(e.to_dict()), e.type


def message(body: bytes, queue: str, attempt: int, errors: bytes | None) -> Message:
    d = orjson.loads(body)
    if not isinstance(d, dict):
        raise MessageDecodeError(f"message body is a JSON {type(d).__name__}, not an object")
    d["queue"] = queue
    d["attempt"] = attempt
    d["errors"] = orjson.loads(errors) if errors else []
    return message_from_dict(d)


def _handed(item: bytes) -> list[Delivery]:
    """The deliveries an enqueue put in a waiter's inbox (see enqueue.lua)."""
    return [
        _delivery([i.encode(), q.encode(), a, body.encode(), err.encode()], 0, int(tk), float(lu))
        for i, q, a, body, err, tk, lu in orjson.loads(item)
    ]


def _delivery(r: list[Any], i: int, token: int, until: float) -> Delivery:
    id_, q, attempt, body, errors = r[i : i + 5]
    queue = q.decode()
    try:
        msg: Message | None = message(body, queue, attempt, errors)
        problem = None
    except (orjson.JSONDecodeError, MessageDecodeError) as exc:
        msg, problem = None, str(exc)
    return Delivery(
        id=id_.decode(),
        message=msg,
        token=token,
        lease_until=until,
        queue=queue,
        raw=None if msg is not None else body,
        decode_error=problem,
    )
