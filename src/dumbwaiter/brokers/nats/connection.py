"""One event loop's connection to NATS, and the process' holder list.

A broker object may serve several event loops (an App's sync calls run on
its portal loop, a worker on its own loop): each gets a ``LoopLink`` of its own
with its connection, pullers, caches and background tasks (the promoter and
the stash reaper).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

from ...errors import BrokerError
from ...message import uuid7
from .. import deadline
from ..clock import ServerClock
from .names import Settings, Subjects, prio_of, untok
from .protocol import (
    CONSUMER_NOT_FOUND,
    STREAM_NAME_IN_USE,
    JetStreamError,
    Reply,
    Unavailable,
    pub_ack,
)
from .puller import GRACE, Pulled, Puller
from .store import Store
from .wire import Wire

log = logging.getLogger("dumbwaiter.nats")
_NS_PER_S = 1_000_000_000
#: seconds a process trusts its cached priority levels and paused queues
CACHE_TTL = 1.0
#: AckWait of the delay consumer: how late a delayed job can be after the
#: process that was moving it died
DELAY_ACK_WAIT = 5.0
#: seconds before a holder list JetStream did not store is written again
WRITE_AGAIN = 0.5
#: at most this long a closing connection tries to leave its final list
FINAL_WRITE = 5.0
#: seconds between PINGs, and the PINGs left unanswered before nats-py calls
#: the connection dead and connects anew: 4 to 6 s after a network cut.  Until
#: then a cut-off host writes into a connection that may never carry anything
#: again (TCP retransmits with backoff, seconds apart after a long cut), and
#: a host whose network heals before that point waits for the next
#: retransmission, or the verdict, to run anything.  Declared dead during the
#: cut instead, it keeps trying to connect and is back within a connect retry
#: of the heal.  Only a server that answers nothing for 4 s trips it (a
#: blocked event loop holds back both the PINGs and their count).
PING_INTERVAL = 2
MAX_OUTSTANDING_PINGS = 2


class Owner(Protocol):
    """What a connection needs of the broker it serves (``core.Core``),
    written out here so that core.py, which makes connections, and this
    module do not import each other."""

    @property
    def settings(self) -> Settings: ...
    @property
    def n(self) -> Subjects: ...
    @property
    def clock(self) -> ServerClock: ...
    @property
    def retention(self) -> float: ...
    @property
    def event_retention(self) -> float: ...
    async def _config(self, link: LoopLink, name: bytes) -> Any: ...
    async def _promote(self, link: LoopLink, items: list[Pulled]) -> None: ...
    async def _reconcile_own(self, link: LoopLink, every: bool = False) -> None: ...


class Holder:
    """This connection's running jobs and finish counts, written to its own
    subject of the HOLD stream (see the module doc: leases and stats)."""

    def __init__(self, link: LoopLink) -> None:
        self.link = link
        host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:24]
        self.id = f"{host}-{os.getpid()}-{uuid7()[-12:]}"
        self.run: dict[str, list[Any]] = {}
        self.fin: dict[str, dict[str, list[int]]] = {}
        #: jobs whose settle is under way here (their count is not in yet)
        self.settling: set[str] = set()
        #: jobs listed by a claim that failed midway (its write may or may not
        #: have been stored): the next rescue looks at their records
        self.unsure: set[str] = set()
        #: the entries ``running`` made since the claim that is sending took them
        self.added: dict[str, list[Any]] = {}
        self.dirty = False
        #: this list was ever written (a producer's connection never writes one)
        self.used = False
        self.closed = False
        self._again: asyncio.TimerHandle | None = None

    def running(self, jid: str, queue: str, until: float) -> None:
        """A claim on its way: [queue, lease until] (the record has the rest).
        A job listed already keeps its entry meanwhile (a live claim of this
        process, whose pointer JetStream delivered again: the new claim will
        not win; or a failed claim's leftover); ``added`` collects the entries
        made, for the claim to take out again what it does not deliver, and
        to hand to ``owned`` for what it delivers."""
        if jid not in self.run:
            e = self.run[jid] = [queue, until]
            self.added[jid] = e
            self.dirty = True

    def owned(self, jid: str, queue: str, until: float, listed: list[Any] | None) -> list[Any]:
        """The entry of a delivery whose claim won (its token keeps it): the
        one that claim listed (``listed``, from ``added``) if it is still the
        job's, else a new one in place of whatever the job has.

        A delivery extends, settles and gives up only its own entry
        (``extended``, ``finished``, ``drop``).  The job may have been listed
        already by an earlier delivery of this process that lost its lease:
        its outcome was waiting to be written (a worker's settles in their
        backoff after a network cut), a rescue gave the job back, and this
        process claimed it again.  That delivery's late settle is fenced off
        at the record, and it used to take the job out of this list anyway,
        by its id, with the entry the new claim had kept: the job no longer
        showed as running, and its second run's success was never counted."""
        if listed is not None and self.run.get(jid) is listed:
            return listed
        e = self.run[jid] = [queue, until]
        self.unsure.discard(jid)  # a failed claim's leftover: this claim is the job's now
        self.dirty = True
        return e

    def _mine(self, jid: str, entry: list[Any] | None) -> list[Any] | None:
        """The job's entry if it is ``entry`` (None: whichever it has)."""
        e = self.run.get(jid)
        return e if e is not None and (entry is None or e is entry) else None

    def drop(self, entries: Mapping[str, list[Any] | None]) -> None:
        """Take these entries out, each only if it is still the same one (a
        new claim of the job meanwhile lists it anew: see ``owned``)."""
        for jid, e in entries.items():
            if self._mine(jid, e) is not None:
                del self.run[jid]
                self.dirty = True

    def extended(self, jid: str, entry: list[Any] | None, until: float) -> None:
        e = self._mine(jid, entry)
        if e is not None:
            e[1] = until
            self.dirty = True

    def finished(self, jid: str, entry: list[Any] | None, queue: str, count: str | None) -> None:
        """A settle: its entry out of the running jobs and counted in one
        step, once (a rescue or ``_reconcile_own`` that took it out counted
        it; another delivery's entry is not this settle's to take)."""
        if self._mine(jid, entry) is not None:
            del self.run[jid]
            if count == "ok":
                self.count(queue, 1, 0, self.link.broker.clock.now())
        self.dirty = True

    def count(self, queue: str, ok: int, cx: int, now: float) -> None:
        b = self.fin.setdefault(queue, {}).setdefault(str(int(now // 60)), [0, 0])
        b[0] += ok
        b[1] += cx
        self.dirty = True

    def write(self) -> asyncio.Future[Reply] | None:
        """Queue a write of the whole list (sent with the next flush; the last
        write wins, and writes from one connection arrive in order).

        A request, not a bare publish: JetStream answers it, and a write it
        did not store (the server restarting, JetStream not ready yet after a
        reconnect, the connection lost with the write in flight) is made
        again ``WRITE_AGAIN`` s later.  A list lost that way stayed as it was
        before: a process that then went idle and exited left jobs listed as
        running that had long finished."""
        if not self.dirty:
            return None
        now = self.link.broker.clock.now()
        oldest = str(int((now - self.link.broker.retention) // 60))
        for q in list(self.fin):
            buckets = {m: c for m, c in self.fin[q].items() if m >= oldest}
            if buckets:
                self.fin[q] = buckets
            else:
                del self.fin[q]
        body = orjson.dumps({"t": now, "run": self.run, "fin": self.fin})
        try:
            fut = self.link.wire.request(self.link.broker.n.h + self.id.encode(), body)
        except Unavailable:
            self.write_again()
            return None
        self.dirty = False
        self.used = True
        fut.add_done_callback(self._stored)
        return fut

    def _stored(self, fut: asyncio.Future[Reply]) -> None:
        try:
            pub_ack(fut.result(), "holder list")
        except (BrokerError, asyncio.CancelledError):
            self.dirty = True  # the next write (or the one below) sends it again
            self.write_again()

    def write_again(self) -> None:
        """Write the list again soon, whatever happens meanwhile (a list that
        was not stored must not wait for the process' next claim or settle)."""
        if self.closed or self._again is not None:
            return
        self._again = self.link.loop.call_later(WRITE_AGAIN, self._write_again)

    def _write_again(self) -> None:
        self._again = None
        if self.closed or not self.dirty:
            return
        if self.write() is not None:
            with contextlib.suppress(Exception):
                self.link.wire.write_now()

    async def leave(self, timeout: float) -> None:
        """The closing connection's last list, written until JetStream stored
        it (or ``timeout``): what a rescuer and ``stats`` read after it is gone."""
        if self.used or self.run:
            deadline = time.monotonic() + timeout
            while True:
                self.dirty = True
                fut = self.write()
                if fut is not None:
                    await self.link.wire.flush()
                    try:
                        pub_ack(await asyncio.shield(fut), "holder list")
                        break
                    except BrokerError:
                        pass
                if time.monotonic() + WRITE_AGAIN > deadline:
                    log.warning("nats: could not leave the holder list %s up to date", self.id)
                    break
                await asyncio.sleep(WRITE_AGAIN)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self._again is not None:
            self._again.cancel()
            self._again = None


class LoopLink:
    """One event loop's connection and what it caches."""

    def __init__(self, broker: Owner, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        s = broker.settings
        options: dict[str, Any] = {
            "name": s.name,
            "connect_timeout": s.connect_timeout,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "ping_interval": PING_INTERVAL,
            "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        }
        if s.user is not None:
            options["user"] = s.user
            options["password"] = s.password or ""
        if s.token is not None:
            options["token"] = s.token
        if s.tls:
            import ssl

            options["tls"] = ssl.create_default_context()
        self.wire = Wire(s.servers, options, s.timeout, self._disconnected, self._reconnected)
        self.store = Store(self.wire, broker.n)
        self.holder = Holder(self)
        self.ready = False
        self._starting: asyncio.Future[None] | None = None
        self.pullers: dict[tuple[str, int], Puller] = {}
        self._made: set[str] = set()
        self.levels: dict[str, set[int]] = {}
        #: queues this connection has registered (the config entry "queues")
        self.queues: set[str] = set()
        #: pointer subjects by (queue, priority)
        self.subjects: dict[tuple[str, int], bytes] = {}
        self.levels_at = 0.0
        self.paused: tuple[float, frozenset[str]] | None = None
        self._promoter: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.swept = 0.0

    async def start(self) -> None:
        """Connect (once for every caller of this loop).  The connect is
        shared, so it keeps no caller's deadline: it gives up after the
        URL's ``reconnect`` seconds, and each caller waits for it no longer
        than its own producer deadline, if it has one."""
        if self._starting is None:
            self._starting = deadline.detached(self.loop, self._start())
        fut = self._starting
        try:
            until = deadline.current()
            if until is None:
                await asyncio.shield(fut)
            else:
                await asyncio.wait_for(asyncio.shield(fut), max(0.0, until - time.monotonic()))
        except TimeoutError:
            last = self.wire.last_error
            where = ", ".join(self.wire.servers)
            why = str(last) if last else "no answer yet"
            raise Unavailable(f"cannot connect to NATS at {where}: {why}") from last
        except BaseException:
            if fut.done():
                self._starting = None
            raise

    async def _start(self) -> None:
        await self.wire.connect(self.broker.settings.reconnect)
        try:
            await self._streams()
        except BaseException:
            await self.wire.close()
            raise
        self.ready = True
        self._reaper = deadline.detached(self.loop, self._reap())

    async def _streams(self) -> None:
        b = self.broker
        for cfg in b.n.stream_configs(b.settings, b.event_retention):
            name = cfg["name"]
            try:
                await self.wire.api(f"STREAM.CREATE.{name}", cfg)
            except JetStreamError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    raise BrokerError(f"nats: cannot create stream {name}: {exc}") from exc
                try:
                    await self.wire.api(f"STREAM.UPDATE.{name}", cfg)
                except JetStreamError as exc2:
                    log.warning("nats: stream %s exists with other settings (%s)", name, exc2)

    async def stop(self) -> None:
        for task in (self._promoter, self._reaper, self._refreshing, self._starting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._promoter = self._reaper = self._refreshing = None
        if self.ready:
            for p in self.pullers.values():
                with contextlib.suppress(Exception):
                    await p.stop()
            with contextlib.suppress(Exception):
                await self.broker._reconcile_own(self, every=True)
            with contextlib.suppress(Exception):
                await self.holder.leave(min(self.wire.timeout, FINAL_WRITE))
        self.holder.close()
        self.pullers.clear()
        self.ready = False
        self._starting = None
        await self.wire.close()

    def _disconnected(self) -> None:
        for p in self.pullers.values():
            p.fail()

    def _reconnected(self) -> None:
        self._made.clear()  # a restarted server may have lost memory-stored consumers
        if self.holder.used or self.holder.run:
            self.holder.dirty = True  # what was in flight at the loss may be lost
            self.holder.write_again()

    # -- consumers and what to pull from ---------------------------------------------

    async def consumer(self, name: str, subject: bytes, ack_wait: float) -> None:
        if name in self._made:
            return
        cfg = {
            "durable_name": name,
            "deliver_policy": "all",
            "ack_policy": "explicit",
            "ack_wait": int(ack_wait * _NS_PER_S),
            "max_deliver": -1,
            "filter_subject": subject.decode(),
            "replay_policy": "instant",
            "max_ack_pending": -1,
            "max_waiting": 4096,
        }
        stream = self.broker.n.work
        try:
            await self.wire.api(
                f"CONSUMER.DURABLE.CREATE.{stream}.{name}", {"stream_name": stream, "config": cfg}
            )
        except JetStreamError as exc:
            if "already" not in str(exc).lower() and exc.err_code != CONSUMER_NOT_FOUND:
                raise
        self._made.add(name)

    async def puller(self, queue: str, prio: int) -> Puller:
        key = (queue, prio)
        p = self.pullers.get(key)
        if p is not None and not p.gone:
            return p
        n = self.broker.n
        name = n.consumer(queue, prio)
        if p is not None:
            self._made.discard(name)
        await self.consumer(name, n.pointer(queue, prio), self.broker.settings.ack_wait)
        if p is None:
            p = Puller(self.wire, n.work, name)
            await p.start()
            self.pullers[key] = p
        p.gone = False
        return p

    def level_seen(self, queue: str, prio: int) -> None:
        self.levels.setdefault(queue, {0}).add(prio)

    async def plan(self, queues: Sequence[str]) -> list[Puller]:
        """The pullers a fetch takes from, in order: each queue's levels,
        highest first; paused queues left out.  Levels and pauses are cached
        (``CACHE_TTL``) and refreshed in the background, off the fetch's path."""
        if self.paused is None or not self.levels_at:
            await self.refresh()
        elif time.monotonic() - self.levels_at > CACHE_TTL and (
            self._refreshing is None or self._refreshing.done()
        ):
            self._refreshing = deadline.detached(self.loop, self._refresh_quietly())
        paused = self.paused_now()
        out = []
        for q in queues:
            if q in paused:
                continue
            for prio in sorted(self.levels.get(q, {0}) | {0}, reverse=True):
                out.append(await self.puller(q, prio))
        return out

    async def refresh(self) -> None:
        """Learn the priority levels in use (from the work subjects) and the
        paused queues (from their config entry)."""
        n = self.broker.n
        found, paused = await asyncio.gather(
            self.store.subjects(n.work, n.w + b"*.*"), self.broker._config(self, b"paused")
        )
        for subject in found:
            parts = subject[len(n.w) :].split(b".")
            if len(parts) == 2:
                self.level_seen(untok(parts[0]), prio_of(parts[1]))
        now = time.monotonic()
        self.levels_at = now
        self.paused = (now, frozenset(paused or []))

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception:  # the next fetch tries again; the cache stays as it was
            log.debug("nats: refreshing levels and pauses failed", exc_info=True)

    def paused_now(self) -> frozenset[str]:
        return self.paused[1] if self.paused is not None else frozenset()

    # -- background ------------------------------------------------------------------

    def start_promoter(self) -> None:
        if self._promoter is None or self._promoter.done():
            self._promoter = deadline.detached(self.loop, self._promote_loop())

    async def _promote_loop(self) -> None:
        """Move due delay entries to the work subjects (see the module doc)."""
        n = self.broker.n
        backoff = 0.05
        p: Puller | None = None
        while True:
            try:
                if p is None or p.gone:
                    await self.consumer(n.delay_consumer, n.d + b">", DELAY_ACK_WAIT)
                    if p is None:
                        p = Puller(self.wire, n.work, n.delay_consumer)
                        await p.start()
                        # listed with the queues' pullers: failed on a lost
                        # connection, expired, reaped and stopped with them
                        self.pullers[("", -1)] = p
                    p.gone = False
                items = await p.pull(256)
                if not items:
                    fut = p.request(1, 5.0)
                    await self.wire.flush()
                    await asyncio.wait_for(fut, 10.0)
                    items = p.take(256)
                if items:
                    await self.broker._promote(self, items)
                backoff = 0.05
            except asyncio.CancelledError:
                if p is not None:
                    with contextlib.suppress(Exception):
                        await p.stop()
                raise
            except Exception as exc:
                if not isinstance(exc, Unavailable | TimeoutError):
                    log.exception("nats: moving due jobs failed; trying again")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _reap(self) -> None:
        """Hand back what stale pull requests delivered and nobody took."""
        while True:
            await asyncio.sleep(GRACE)
            timeout = self.wire.timeout
            for p in list(self.pullers.values()):
                p.expire(timeout)
                if p.stash and not p.waits:
                    p.give_back()
            with contextlib.suppress(Exception):
                await self.wire.flush()
