"""Looking at and acting on stored jobs on RabbitMQ (the seam's admin part):
counts, pages of jobs, replay, purge, cancel, reschedule, pause.

Every job has a record in the state store (ledger.py), so the admin reads
records, not queues.  A call that changes jobs sends their new copies
first and then writes the records, each only if it is still the record
read (``_write_if_unchanged``): a job a worker leased, or another call changed, in
between is left as it is, and the new copy is dropped as stale.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pamqp import commands as spec

from ...errors import BrokerError
from ...message import EVENT
from ...state import State
from .. import transitions as T
from ..base import KvWrite
from ..listing import jobs_page
from ..record import Record, count_states
from ..types import JobFilter, JobInfo, Page, QueueStats, stats_rows
from .ledger import KEY_ROUNDS, RabbitMQLedger, Stamp, stamp_of, still_unchanged
from .link import AMQP_ERRORS

log = logging.getLogger("dumbwaiter.rabbitmq")


class RabbitMQAdmin(RabbitMQLedger):
    """The seam's admin methods on RabbitMQ (mixed into ``RabbitMQBroker``)."""

    async def _records(self) -> list[Record]:
        found = await self.state.kv_scan(self.keys.job)
        return [Record.load(v) for v in found.values()]

    async def stats(self) -> list[QueueStats]:
        now = await self._now()
        k = self.keys
        queues = {q[len(k.queue) :] for q in await self.state.kv_scan(k.queue)}
        paused = {q[len(k.paused) :] for q in await self.state.kv_scan(k.paused)}
        counts: dict[str, dict[str, float]] = {q: {} for q in queues | paused}
        count_states(await self._records(), now, counts)
        return stats_rows(counts, paused)

    async def _matching(self, filter: JobFilter) -> list[Record]:
        now = await self._now()
        if filter.ids is not None:
            got = await self.state.kv_get([self.keys.job + i for i in filter.ids])
            recs = [Record.load(v) for v in got.values()]
        else:
            recs = await self._records()
        return [r for r in recs if filter.matches(r.info(now))]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        now = self.clock.now()
        return jobs_page([r.info(now) for r in await self._matching(filter)], cursor, limit)

    async def get(self, id: str) -> JobInfo | None:
        got = await self.state.kv_get([self.keys.job + id])
        raw = got.get(self.keys.job + id)
        return None if raw is None else Record.load(raw).info(self.clock.now())

    async def replay(self, filter: JobFilter) -> int:
        """Dead jobs back to ready.  The new copies are confirmed first (a
        crash before the records are written loses nothing: a copy ahead of
        its record waits for it, even while it still says dead, and wins
        after ``RECORD_GRACE``), then the records change in one
        ``kv_update``, each only if it is still the record read (``_write_if_unchanged``):
        a job purged or replayed by another call meanwhile is left as that
        call made it, and its new copy here is dropped (stale, or a second
        copy of the same version).

        A dead letter that is not an envelope goes back to its queue as it
        came, as the SQL brokers put theirs back: its copy is sent after its
        record (no worker can judge a body it cannot decode against a
        version, so the record must be ready first; a crash in between
        leaves a ready record that ``_reconcile`` sends again), and a worker
        that still cannot decode it dead-letters it under the same record."""
        now = await self._now()
        planned: dict[str, tuple[Stamp, bytes]] = {}
        copies = []
        raws: dict[str, Record] = {}
        for rec in await self._matching(filter):
            before = stamp_of(rec)
            if not T.replay(rec, now):
                continue
            key = self.keys.job + rec.msg.id
            if rec.raw is not None:
                raws[key] = rec
            else:
                copies.append(self._copy(rec.msg, rec.ver, now))
            planned[key] = (before, rec.dump())
        if not planned:
            return 0
        await self._send(copies, True)
        won = await self._write_if_unchanged(planned)
        if won:
            await self._sweep_dlq({key[len(self.keys.job) :] for key in won})
        await self._send([self._raw_copy(raws[key]) for key in won if key in raws], True)
        return len(won)

    async def purge(self, filter: JobFilter) -> int:
        """Delete the matching jobs that are not running.

        One ``kv_update`` marks the records cancelled (a new version), each
        only if it is still the record read (``_write_if_unchanged``'s rule): a job a
        worker leased (or another call changed) since the read is left
        alone, and a marked job can no longer be leased, replayed or
        rescheduled (every queued copy of it is dropped).  The same update
        frees the unique keys the marked jobs still hold (a newer job may
        have taken one over: the old job keeps its message's key, and
        freeing that one's key would let a duplicate in); a freed key's
        entry stays, empty, which ``_key_holder`` reads as free, since only
        a compare-and-delete could remove it safely.  The marks and the
        freed entries are written with the ttl of the jobs' tombstones, so a
        purge that dies before its deletes leaves nothing that stays.  Then
        tombstones and the deletes, which nothing can race any more."""
        k = self.keys
        read = [r for r in await self._matching(filter) if r.state is not State.RUNNING]
        if not read:
            return 0
        now = await self._now()
        planned: dict[str, tuple[Stamp, bytes]] = {}
        ttls: dict[str, float] = {}  # job's record key -> how long its mark stays
        holds: dict[str, str] = {}  # job's record key -> its unique key's entry
        for r in read:
            before = stamp_of(r)
            mark = Record.load(r.dump())
            mark.state, mark.updated_at = State.CANCELLED, now
            mark.ver += 1
            planned[k.job + r.msg.id] = (before, mark.dump())
            ttls[k.job + r.msg.id] = self._ttl_past_due(r, now)
            kk = self._entry_of(r)
            if kk is not None:
                holds[k.job + r.msg.id] = kk

        def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], set[str]]:
            marks = still_unchanged(planned, got)
            writes: dict[str, KvWrite] = {key: (v, ttls[key]) for key, v in marks.items()}
            for key in marks:
                kk = holds.get(key)
                if kk is not None and got.get(kk, b"").decode() == key[len(k.job) :]:
                    writes[kk] = (b"", ttls[key])
            return writes, set(marks)

        won = await self.state.kv_update([*planned, *sorted(set(holds.values()))], decide)
        gone = [r for r in read if k.job + r.msg.id in won]
        if not gone:
            return 0
        # a tombstone each, kept until every copy still queued has come up
        # (a copy without a record would otherwise run)
        ttl = max(ttls[k.job + r.msg.id] for r in gone)
        await self.state.kv_set({k.claim + "gone:" + r.msg.id: b"1" for r in gone}, ttl=ttl)
        await self.state.kv_delete([k.job + r.msg.id for r in gone])
        await self._sweep_dlq({r.msg.id for r in gone if r.state is State.DEAD})
        return len(gone)

    async def _sweep_dlq(self, ids: set[str]) -> None:
        """Take the DLQ copies of jobs that left the dead state out of the DLQ
        (a read of each DLQ on a channel of its own; the rest go back)."""
        if not ids:
            return
        link = await self._link()
        queues = {q[len(self.keys.dlq) :] for q in await self.state.kv_scan(self.keys.dlq)}
        conn = link.conn
        if conn is None:
            return
        try:
            ch = await conn.channel()
            try:
                for q in queues:
                    ok = await ch.queue_declare(self.names.dlq(q), passive=True)
                    for _ in range(int(ok.message_count or 0)):
                        m = await ch.basic_get(self.names.dlq(q), no_ack=False)
                        d = m.delivery
                        if not isinstance(d, spec.Basic.GetOk):
                            break
                        if (m.header.properties.message_id or "") in ids:
                            await ch.basic_ack(int(d.delivery_tag or 0))
            finally:
                await ch.close()  # unacked copies go back to their DLQ
        except AMQP_ERRORS as exc:
            log.warning("could not sweep the dead-letter queues: %r", exc)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        """Cancel in one ``kv_update``: a fetch of the same job either sees
        the cancel (and drops the copy) or leased it first (and the job is
        not cancellable), never both.

        Each cancelled record is written once, in that update, with its ttl:
        kept until its queued copy has come up and been dropped
        (``_ttl_past_due``; a second write after the update would bring back a
        record that a purge deleted in between).  The unique key a cancelled
        job still holds gets the same ttl in the same update (it blocks as
        long as the record is kept, as a finished job's does).  Which
        entries those are is in the records: an update that finds a
        cancellable job whose key's entry it did not read writes nothing
        and names the entries, and the next one reads them too (jobs
        without a key: one update)."""
        now = await self._now()
        k = self.keys
        wanted = list(dict.fromkeys(k.job + i for i in ids))
        known: frozenset[str] = frozenset()
        for _ in range(KEY_ROUNDS):

            def decide(
                got: dict[str, bytes], known: frozenset[str] = known
            ) -> tuple[dict[str, KvWrite], list[str] | frozenset[str]]:
                writes: dict[str, KvWrite] = {}
                done: list[str] = []
                missing: set[str] = set()
                for key in wanted:
                    raw = got.get(key)
                    if raw is None:
                        continue
                    rec = Record.load(raw)
                    if not T.cancellable(rec, now):
                        continue
                    kk = self._entry_of(rec)
                    if kk is not None and kk not in known:
                        missing.add(kk)
                        continue
                    T.cancel(rec, now)  # a new version: its queued copy is stale
                    ttl = self._ttl_past_due(rec, now)
                    writes[key] = (rec.dump(), ttl)
                    id_ = key[len(k.job) :]
                    if kk is not None and got.get(kk, b"").decode() == id_:
                        writes[kk] = (id_.encode(), ttl)
                    done.append(id_)
                if missing:
                    return {}, known | missing  # read those entries too, and decide again
                return writes, done

            out = await self.state.kv_update([*wanted, *sorted(known)], decide)
            if isinstance(out, list):
                return out
            known = out
        raise BrokerError("rabbitmq cancel: the jobs' unique keys kept changing")

    def _ttl_past_due(self, rec: Record, now: float) -> float:
        """Seconds a record or tombstone must stay so that the job's queued
        copy (due at ``run_at``) finds it: retention past the due time."""
        keep = self.event_retention if rec.msg.kind == EVENT else self.retention
        return max(keep, rec.run_at - now + keep)

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        """Waiting jobs to run at ``at``: copies first, then the records in one
        ``_write_if_unchanged`` (see ``replay``).  A job a worker leased, or another call
        changed, between the read and the write is not rescheduled (and not
        returned); its new copy is stale, or parks behind the live lease
        (``_judge``) and is dropped once the job is done."""
        now = await self._now()
        at = self.clock.to_server(at)
        got = await self.state.kv_get([self.keys.job + i for i in ids])
        planned: dict[str, tuple[Stamp, bytes]] = {}
        copies = []
        for i in ids:
            key = self.keys.job + i
            raw = got.get(key)
            if raw is None or key in planned:
                continue
            rec = Record.load(raw)
            before = stamp_of(rec)
            if not T.reschedule(rec, at, now):
                continue
            copies.append(self._copy(rec.msg, rec.ver, rec.run_at))
            planned[key] = (before, rec.dump())
        if not planned:
            return []
        await self._send(copies, True)
        won = set(await self._write_if_unchanged(planned))
        return [key[len(self.keys.job) :] for key in planned if key in won]

    async def pause(self, queue: str) -> None:
        await self.state.kv_set({self.keys.paused + queue: b"1", self.keys.queue + queue: b"1"})
        link = self._links.current()
        if link is not None and link.ok():
            link.paused_until[queue] = self.clock.now() + 1.0
            for lq in self.names.lanes(queue):
                await link.cancel(lq)

    async def resume(self, queue: str) -> None:
        await self.state.kv_delete([self.keys.paused + queue])
        link = self._links.current()
        if link is not None:
            link.paused_until.pop(queue, None)
            link.looked_at = 0.0
            link.arrived.set()
