"""The worker's outcomes on RabbitMQ: ``ack``, ``retry``, ``requeue``,
``dead``, ``extend``, and ``rescue`` of the leases that ran out.

An outcome is written to the job's record first, then the AMQP message is
acked (a worker that dies in between leaves a copy the ledger drops as
finished).  A lease with more than ``SURE`` seconds to run is the worker's
without asking the state store (``_still_leased``); the writes that follow compare
the record first (``_write_if_unchanged``), so a lease that ran out meanwhile is never
written over.  An ack's records are written by this loop's next admission when
one comes within a few turns (``_ack_with_admission``): one state-store trip for both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from pamqp import commands as spec

from ...errors import MessageDecodeError
from ...message import TASK, ErrorRecord, Message
from ...state import State
from .. import transitions as T
from ..base import KvWrite
from ..finished import compacts
from ..record import Record
from ..types import DeadLetter, Delivery, Rescued
from . import topology as topo
from .ledger import (
    AckOnAdmission,
    RabbitMQLedger,
    Stamp,
    Token,
    stamp_of,
    still_held,
    still_unchanged,
)
from .link import AMQP_ERRORS

log = logging.getLogger("dumbwaiter.rabbitmq")

#: seconds of lease left under which an outcome reads the record (fencing)
SURE = 1.0
#: turns of the event loop an ack waits for this loop's next admission to
#: carry its records (``_ack_with_admission``); then it writes them alone
ACK_WAIT_TURNS = 6
#: seconds between reconciles of the records with the lanes (``_reconcile``):
#: each process tries once per period, and one process of the app does it
RECONCILE_EVERY = 60.0
#: seconds a job must have been due, beyond its producer's ``reconnect``
#: window, before a reconcile may send its copy again
STRANDED_AFTER = 30.0
#: most copies one reconcile sends (the longest waiting first)
RECONCILE_MAX = 1000
#: what a waiting record holds, as ``Record.dump`` writes it: a reconcile
#: parses only records that contain one
_WAITING_MARKS = (b'"s":"ready"', b'"s":"scheduled"')


class RabbitMQOutcomes(RabbitMQLedger):
    """The seam's outcome methods and ``rescue`` on RabbitMQ (mixed into
    ``RabbitMQBroker``)."""

    async def _still_leased(self, ds: Sequence[Delivery]) -> list[tuple[Delivery, Record]]:
        """The deliveries whose lease is still theirs, with their records.

        A lease with more than ``SURE`` seconds to run is ours without asking
        the state store: only an expired lease is rescued or taken over (and
        admin calls never touch running jobs), so the record this broker
        wrote at fetch or heartbeat is the record when the outcome is
        decided.  Others are read.  The outcome's write compares it again
        (``still_held``, ``_write_if_unchanged``): it may reach the store only after the
        lease ran out."""
        k = self.keys
        now = await self._now()
        out = []
        ask = []
        for d in ds:
            tok = d.token
            if d.message is None or not isinstance(tok, Token):
                continue
            rec = self._leased_records.get(d.id)
            if rec is not None and rec.token == tok.record and d.lease_until > now + SURE:
                out.append((d, rec))
            else:
                ask.append(d)
        got = await self.state.kv_get([k.job + d.id for d in ask]) if ask else {}
        for d in ask:
            raw = got.get(k.job + d.id)
            if raw is None:
                continue
            rec = Record.load(raw)
            tok = d.token
            if rec.state is State.RUNNING and isinstance(tok, Token) and rec.token == tok.record:
                out.append((d, rec))
        return out

    async def _finish(self, ds: Sequence[Delivery]) -> None:
        """Ack the deliveries' AMQP messages and forget their leases."""
        for d in ds:
            if self._leases_held.get(d.id, (None,))[0] == getattr(d.token, "record", None):
                self._leases_held.pop(d.id, None)
                self._leased_records.pop(d.id, None)
        link = self._links.current()
        if link is None:
            return
        by_gen: dict[int, list[int]] = {}
        for d in ds:
            if isinstance(d.token, Token):
                by_gen.setdefault(d.token.gen, []).append(d.token.tag)
        try:
            for gen, tags in by_gen.items():
                await link.ack(gen, tags)
        except AMQP_ERRORS as exc:  # RabbitMQ puts them back; the ledger drops them
            await self._failed(link, "ack", exc)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        """Succeeded records, kept ``retention`` (or their result's time),
        each written only where the record still holds the lease this worker
        had (``still_held``): a late ack (its write held up past the lease,
        the job rescued and run again) changes nothing.

        A job that holds a unique key keeps it exactly as long as its record
        (a key without a unique mode blocks while its holder's record is
        kept): the key's entry gets the record's ttl in the same
        ``kv_update``, only if it still names the job (a newer job that took
        the key over keeps it, with no expiry).  Jobs without a key are
        written by this loop's next admission when one comes
        (``_ack_with_admission``)."""
        now = await self._now()
        planned: dict[str, tuple[Stamp, KvWrite]] = {}
        holds: list[tuple[str, str, float]] = []  # (key's entry, job id, ttl)
        for d, held in await self._still_leased(ds):
            # a new record: the held one stays as it is, for an ack made
            # again after this one failed
            rec = held.copy()
            if not T.succeed(rec, held.token, now, d.result, compacts(d)):
                continue
            ttl = T.kept_for(self.retention, d.result, d.result_ttl)
            planned[self.keys.job + d.id] = (stamp_of(held), (rec.dump(), ttl))
            kk = self._entry_of(rec)
            if kk is not None:
                holds.append((kk, d.id, ttl))
        if planned and (holds or not await self._ack_with_admission(planned, {d.id for d in ds})):
            job = self.keys.job

            def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], None]:
                writes = still_held(planned, got)
                for kk, id_, ttl in holds:
                    if job + id_ in writes and got.get(kk, b"").decode() == id_:
                        writes[kk] = (id_.encode(), ttl)
                return writes, None

            await self.state.kv_update([*planned, *sorted({kk for kk, _, _ in holds})], decide)
        await self._finish(ds)

    async def _ack_with_admission(
        self, planned: dict[str, tuple[Stamp, KvWrite]], ids: set[str]
    ) -> bool:
        """Write an ack's records with this loop's next admission, if one
        comes within ``ACK_WAIT_TURNS`` turns of the loop: True once written that
        way, False if none came (the caller writes them alone).

        A worker's finished jobs wake its settler (the ack) and its fetch
        loop (the next admission) together, and on a busy worker the
        admission's ``kv_update`` comes a few turns later: the records
        are written in it, one state-store trip for both, compared as the ack's own
        write compares them.  Either way the records are written before the
        AMQP ack, as before."""
        link = self._links.current()
        if link is None:
            return False
        pending = AckOnAdmission(dict(planned), ids, asyncio.get_running_loop().create_future())
        link.acks_on_admission.append(pending)
        try:
            for _ in range(ACK_WAIT_TURNS):
                if pending.taken:
                    break
                await asyncio.sleep(0)
            if not pending.taken:
                return False
            await pending.done
            return True
        finally:
            if pending in link.acks_on_admission:  # not taken (or cancelled while waiting)
                link.acks_on_admission.remove(pending)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        await self._wait_again(ds, charge=True)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        await self._wait_again(ds, charge=False)

    async def _wait_again(self, ds: Sequence[Delivery], charge: bool) -> None:
        """A new copy, due at ``d.retry_at``; then the old one goes.

        The record is written only where it is still the lease read
        (``_write_if_unchanged``): ``_still_leased`` trusts a lease with more than ``SURE`` to
        run, and a publish slower than that lets the lease run out, the job
        be rescued and another worker take it.  A blind write then set the
        record back under that worker's running job (its ack fenced off, the
        rescue's copy and this one of one version: a job no copy served)."""
        now = await self._now()
        writes: dict[str, tuple[Stamp, bytes]] = {}
        copies = []
        for d, held in await self._still_leased(ds):
            before = stamp_of(held)
            # a new record, as ``ack``'s: the held one (this broker's cache)
            # stays as it is, for a call made again after this one failed
            rec = held.copy()
            rec.msg = held.msg.copy()
            at = self.clock.to_server(d.retry_at)
            if charge:
                T.retry(rec, rec.token, at, now, d.error)
            else:
                T.requeue(rec, rec.token, at, now)
            copies.append(self._copy(rec.msg, rec.ver, rec.run_at))
            writes[self.keys.job + d.id] = (before, rec.dump())
        await self._send(copies, True)
        if writes:
            await self._write_if_unchanged(writes)
        await self._finish(ds)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        """The job's copy to the DLQ, its record dead where it is still the
        lease read (``_write_if_unchanged``, as ``_wait_again``)."""
        now = await self._now()
        writes: dict[str, tuple[Stamp, bytes]] = {}
        copies = []
        for d, held in await self._still_leased(ds):
            before = stamp_of(held)
            rec = held.copy()  # as ``_wait_again``'s
            rec.msg = held.msg.copy()
            T.bury(rec, rec.token, now, d.error)
            copies.append(self._dead_copy(rec.msg, rec.msg.queue))
            writes[self.keys.job + d.id] = (before, rec.dump())
        undecodable = [d for d in ds if d.message is None and isinstance(d.token, Token)]
        if undecodable:
            copies += await self._bury_undecodable(undecodable, now)
        await self._send(copies, True)
        if writes:
            await self._write_if_unchanged(writes)
        await self._finish(ds)

    async def _bury_undecodable(
        self, ds: Sequence[Delivery], now: float
    ) -> list[tuple[str, str, bytes, spec.Basic.Properties]]:
        """Dead records of messages that are not envelopes, written before
        their dead letters go to the DLQ (body as it came, error in headers,
        the record's id as message id, so that ``purge`` and ``replay`` take
        it out again): a dead job like any other for ``list_jobs``,
        ``stats``, ``get`` (with the body, ``Record.raw``), ``purge`` and
        ``replay``.  Kept only in the DLQ, no process but the one that
        logged it knew of it.  The copies to send.

        A message seen for the first time gets a record of its own (its
        delivery's new id); one a replay put back (``_raw_copy``) is dead
        again under its record, only if that record is still the ready one
        of the copy's version: a second copy of it (a reconcile's), or one
        purged since, is dropped.  A worker killed between the record and
        the ack leaves its message to be delivered again: a second record."""
        k = self.keys
        gone = k.claim + "gone:"
        fresh: dict[str, tuple[int, Record]] = {}
        for d in ds:
            assert isinstance(d.token, Token)
            err = d.error or ErrorRecord(
                time=now,
                type=f"dumbwaiter.errors.{MessageDecodeError.__name__}",
                message=d.decode_error or "undecodable body",
            )
            stub = Message(
                id=d.id, kind=TASK, name="?", queue=d.queue, attempt=1, created_at=now, errors=[err]
            )
            rec = Record(msg=stub, state=State.DEAD, run_at=now, updated_at=now, raw=d.raw or b"")
            fresh[d.id] = (d.token.record, rec)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], list[Record]]:
            writes: dict[str, bytes] = {}
            buried: list[Record] = []
            for id_, (ver, new) in fresh.items():
                if gone + id_ in got:
                    continue  # purged after its replay: its copy is dropped
                old = got.get(k.job + id_)
                rec = new
                if old is not None:
                    rec = Record.load(old)
                    if rec.raw is None or rec.state is not State.READY or rec.ver != ver:
                        continue  # a stale copy (a twin, or replayed or purged since)
                    rec.msg.attempt += 1
                    rec.msg.errors.append(new.msg.errors[-1])
                    rec.state, rec.updated_at, rec.raw = State.DEAD, now, new.raw
                    rec.ver += 1
                writes[k.job + id_] = rec.dump()
                buried.append(rec)
            return writes, buried

        keys = [key for id_ in fresh for key in (k.job + id_, gone + id_)]
        buried = await self.state.kv_update(keys, decide)
        return [self._dead_copy(r.msg, r.msg.queue, r.raw) for r in buried]

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        """Move each lease still this worker's ``lease`` seconds ahead.

        The record is written only where it is still the one this worker
        holds (``_write_if_unchanged``'s compare, in one ``kv_update`` with the lease map):
        a rescue, or another worker's takeover of the expired lease, may
        have come between ``_still_leased``'s look and this write, and a blind
        write would set the job back under that worker (its ack fenced off)
        or undo a rescue's dead letter.  Such a lease is reported lost.  The
        rescuer's compare includes the lease's end, so of a heartbeat and a
        rescue that meet, exactly one wins."""
        now = await self._now()
        k = self.keys
        planned: dict[str, tuple[Stamp, bytes]] = {}
        renewed: dict[str, tuple[Delivery, Record]] = {}
        for d, rec in await self._still_leased(ds):
            new = rec.copy()
            T.extend(new, rec.token, now + lease)
            planned[k.job + d.id] = (stamp_of(rec), new.dump())
            renewed[k.job + d.id] = (d, new)
        lease_key = k.lease + self.instance
        added = self._leases_added
        held = dict(self._leases_held)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], set[str]]:
            writes = still_unchanged(planned, got)
            mine = dict(held)
            for key, (d, rec) in renewed.items():
                if key in writes:
                    mine[d.id] = (rec.token, rec.lease_until)
                else:
                    mine.pop(d.id, None)
            won = set(writes)
            writes[lease_key] = orjson.dumps({"at": now, "held": mine})
            return writes, won

        won = await self.state.kv_update(list(planned), decide)
        for key, (d, rec) in renewed.items():
            if key in won:
                d.lease_until = rec.lease_until
                # only a lease still held as it was: an ack that came while
                # the write was out has forgotten it, a new fetch replaced it
                if self._leases_held.get(d.id, (None,))[0] == rec.token:
                    self._leases_held[d.id] = (rec.token, rec.lease_until)
                    self._leased_records[d.id] = rec
        lost = [d for d in ds if d.message is not None and k.job + d.id not in won]
        for d in lost:
            if self._leases_held.get(d.id, (None,))[0] == getattr(d.token, "record", None):
                self._leases_held.pop(d.id, None)
                self._leased_records.pop(d.id, None)
        if self._leases_added != added:
            # a fetch leased jobs while the write was out, and the map just
            # written came from the copy taken before it: without them, a
            # rescuer would not see those leases expire if this worker hung
            await self.state.kv_set({lease_key: self._lease_map(now)})
        return lost

    async def rescue(self) -> Rescued:
        """Jobs whose lease ran out (their worker hung or died) get a new copy
        (or go dead); each is claimed once, so rescuers never double it.  The
        dead letters fetches found since the last call are reported (and
        counted) too; kept for the next call if this one fails.  Once every
        ``RECONCILE_EVERY`` s, waiting jobs left without a copy get one
        (``_reconcile``)."""
        found = list(self._found_dead)
        self._found_dead.clear()
        try:
            n, dead = await self._rescue_leases()
        except BaseException:
            self._found_dead.extendleft(reversed(found))
            raise
        if time.monotonic() >= self._reconcile_at:
            self._reconcile_at = time.monotonic() + RECONCILE_EVERY
            try:
                await self._reconcile()
            except Exception as exc:  # the next period tries again; the leases are done
                log.warning("rabbitmq reconcile failed: %r; trying again later", exc)
        return Rescued(n + len(found), found + dead)

    async def _reconcile(self) -> int:
        """Send a copy again for each job whose record waits, due long ago,
        in a lane RabbitMQ holds no message for: how many were sent.

        Such a record has no copy: its producer was killed while RabbitMQ
        was unreachable (the record is written while the copy is published,
        and the publish is tried again for ``reconnect`` s), or its failed
        enqueue could not delete it again.  Listed for ever, run never.  The
        record holds the message, so it is sent again, at the record's own
        version: should the first copy still exist after all (unacked in a
        worker's buffer), the two are one job's copies of one version, and
        the ledger runs it once (the second is dropped as a copy sent
        twice, or as a finished job's).

        Bounded: one process of the app per ``RECONCILE_EVERY`` (a claim in
        the state store), lanes looked at first (a passive declare each) and
        the records read only when one is empty; only records waiting in an
        empty lane (a lane with messages may still hold their copies:
        sending them again would put them behind the backlog), due more
        than ``STRANDED_AFTER`` plus ``reconnect`` s ago (the producer has
        given up, and deleted the record if it could), at most
        ``RECONCILE_MAX`` of them."""
        k = self.keys
        if not await self.state.kv_add(k.claim + "reconcile", b"1", ttl=RECONCILE_EVERY):
            return 0  # another process of the app does this period's
        empty = await self._empty_lanes()
        if not empty:
            return 0
        now = await self._now()
        horizon = now - STRANDED_AFTER - self.reconnect
        stranded: list[Record] = []
        for raw in (await self.state.kv_scan(k.job)).values():
            if not any(mark in raw for mark in _WAITING_MARKS):
                continue  # finished or running: most records, never parsed
            rec = Record.load(raw)
            if rec.state not in (State.READY, State.SCHEDULED):
                continue
            if max(rec.run_at, rec.updated_at) > horizon:
                continue
            lane = topo.MAIN if rec.raw is not None else topo.lane_of(rec.msg.priority)
            if self.names.lane(rec.msg.queue, lane) in empty:
                stranded.append(rec)
        if not stranded:
            return 0
        stranded.sort(key=lambda r: r.run_at)
        stranded = stranded[:RECONCILE_MAX]
        log.warning(
            "rabbitmq: %d waiting job(s) had no copy in their lane (their producer died"
            " before RabbitMQ confirmed it?); sending their copies again: %s",
            len(stranded),
            ", ".join(r.msg.id for r in stranded[:10]) + (" ..." if len(stranded) > 10 else ""),
        )
        await self._send([self._copy_of(r, now) for r in stranded])
        return len(stranded)

    async def _empty_lanes(self) -> set[str]:
        """The lanes (of every queue this app declared) that hold no ready
        message, by a passive declare each on a channel of its own (a lane
        that is gone closes it: it is opened again, and that lane skipped)."""
        k = self.keys
        lanes = {self.names.lane(q[len(k.queue) :]) for q in await self.state.kv_scan(k.queue)}
        for key in await self.state.kv_scan(k.lane):
            queue, lane = key[len(k.lane) :].split("\x1f", 1)
            lanes.add(self.names.lane(queue, lane))
        link = await self._link()
        if link.conn is None or not lanes:
            return set()
        empty: set[str] = set()
        ch = await link.conn.channel()
        try:
            for name in sorted(lanes):
                try:
                    ok = await ch.queue_declare(name, passive=True)
                except AMQP_ERRORS:
                    if not link.ok():
                        raise
                    ch = await link.conn.channel()  # the lane is gone: skip it
                    continue
                if not ok.message_count:
                    empty.add(name)
        finally:
            if not ch.is_closed:
                await ch.close()
        return empty

    async def _rescue_leases(self) -> tuple[int, list[DeadLetter]]:
        """``rescue`` of the expired leases: how many, and the dead-lettered."""
        now = await self._now()
        k = self.keys
        maps = await self.state.kv_scan(k.lease)
        expired: dict[str, int] = {}
        owners: dict[str, dict[str, Any]] = {}
        for key, raw in maps.items():
            d = orjson.loads(raw)
            owners[key] = d
            for id_, (token, until) in d["held"].items():
                if until < now:
                    expired[id_] = int(token)
        if not expired:
            return 0, []
        got = await self.state.kv_get([k.job + i for i in expired])
        planned: dict[str, tuple[Stamp, bytes]] = {}
        copies = []
        claims: list[str] = []
        dead: dict[str, DeadLetter] = {}
        for id_, token in expired.items():
            found = got.get(k.job + id_)
            if found is None:
                continue
            rec = Record.load(found)
            if rec.token != token or not T.expired(rec, now):
                continue
            claim = f"{k.claim}rescue:{id_}:{token}"
            if not await self.state.kv_add(claim, b"1", ttl=3600):
                continue
            claims.append(claim)
            stamp = stamp_of(rec)
            if T.rescue(rec, now) is State.DEAD:
                copies.append(self._dead_copy(rec.msg, rec.msg.queue))
                dead[k.job + id_] = DeadLetter(
                    id_, rec.msg.queue, rec.msg.name, rec.msg.errors[-1], rec.msg.copy()
                )
            else:
                copies.append(self._copy(rec.msg, rec.ver, now))
            planned[k.job + id_] = (stamp, rec.dump())
        # The copies go first (a rescuer that dies next loses nothing: a copy
        # ahead of its record wins after RECORD_GRACE).  The records are then
        # written only where they are still the expired lease read above:
        # since then, a redelivered copy may have taken the job over (its
        # admission leases an expired job) and even finished it; a blind write
        # would set that job back to ready after its new copy was judged
        # stale, a record no copy serves (the crash test's stuck jobs).  A
        # copy whose write lost is ahead of its record: dropped once the job
        # is finished, parked while it is leased (``_judge_ahead``).
        try:
            await self._send(copies, True)
        except BaseException:
            # unclaimed, or these leases would wait out the claim's hour
            # before the next rescue (of this or another process) tried them
            try:
                await self.state.kv_delete(claims)
            except Exception:
                log.exception("could not release the claims of a failed rescue")
            raise
        won = await self._write_if_unchanged(planned) if planned else []
        dead_letters = [dead[key] for key in won if key in dead]
        # tidy other owners' lease maps: what is rescued or finished leaves them
        gone = [
            key
            for key, d in owners.items()
            if key != k.lease + self.instance
            and float(d["at"]) < now - 60
            and all(u < now for _, u in d["held"].values())
        ]
        if gone:
            await self.state.kv_delete(gone)
        return len(won), dead_letters
