"""The admin part of the NATS broker: stats, listings, replay, purge, cancel,
reschedule, pause and resume.

Counts come from JetStream's own bookkeeping, never from reading jobs:
ready from the work consumers, scheduled and retrying from the delay
subjects, dead from the DLQ stream, running and finished from the holders'
lists (only a list entry whose lease ran out is checked against its job's
record).  Listings read the job index (a scan), except running (the holders)
and dead (the DLQ).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import MessageDecodeError
from ...state import CANCELLABLE_STATES, State
from ..listing import jobs_page
from ..types import JobFilter, JobInfo, Page, QueueStats
from . import records as R
from .connection import LoopLink
from .moves import Moves
from .names import Subjects, prio_of, untok
from .pointers import (
    fresh_of,
    fresh_record,
)
from .protocol import (
    JetStreamError,
    Reply,
    header,
)
from .store import Stored, is_conflict, stored


class Admin(Moves):
    async def get(self, id: str) -> JobInfo | None:
        return await self._get(await self._link(), id)

    async def stats(self) -> list[QueueStats]:
        """Counts from JetStream's bookkeeping (see the module doc), read in an
        order that never loses a job moving while they are read.

        Every move adds the job to its next place before it leaves the last
        one, so each place is read before the places jobs move to from it:
        delay subjects, then the work consumers (due jobs come from the
        delay subjects), then the holder lists (claimed jobs come from the
        work consumers), then the delay subjects and the DLQ again (retried
        and dead jobs come from the holders).  A job may be seen twice while
        it moves, never not at all; at rest every count is exact."""
        link = await self._link()
        n = self.n
        store = link.store
        declared, paused, first = await asyncio.gather(
            self._config(link, b"queues"),
            self._config(link, b"paused"),
            store.subjects(n.work, n.base + b"*.>"),
        )
        levels, delayed = _work_subjects(n, first)
        queues: set[str] = set(declared or []) | set(paused or []) | set(levels)
        queues |= {q for q, _ in delayed}
        keys = sorted({(q, p) for q in queues for p in {0, *levels.get(q, {})}})
        consumers = await self._consumer_infos(link, keys)
        holders = await self._holders(link)
        second, dead = await asyncio.gather(
            store.subjects(n.work, n.base + b"*.>"), store.subjects(n.dlq, n.x + b"*")
        )
        levels2, delayed2 = _work_subjects(n, second)
        for k, c in delayed2.items():
            delayed[k] = max(delayed.get(k, 0), c)
        now = self.clock.now()
        dead_by = {untok(s[len(n.x) :]): c for s, c in dead.items()}
        running = await self._running_counts(link, holders, now)
        fin: dict[str, list[int]] = {}
        oldest = str(int((now - self.retention) // 60))
        for _, _, content in holders:
            for q, buckets in content.get("fin", {}).items():
                f = fin.setdefault(q, [0, 0])
                for minute, (ok, cx) in buckets.items():
                    if minute >= oldest:
                        f[0] += ok
                        f[1] += cx
        queues |= set(dead_by) | set(running) | set(fin) | {q for q, _ in delayed}
        ready, lag = await self._ready(link, consumers, levels2, running, now)
        out = []
        for q in sorted(queues):
            f = fin.get(q, [0, 0])
            out.append(
                QueueStats(
                    queue=q,
                    ready=ready.get(q, 0),
                    scheduled=delayed.get((q, b"s"), 0),
                    retrying=delayed.get((q, b"r"), 0),
                    running=running.get(q, 0),
                    dead=dead_by.get(q, 0),
                    succeeded=f[0],
                    cancelled=f[1],
                    lag=lag.get(q, 0.0),
                    paused=q in (paused or []),
                )
            )
        return out

    async def _running_counts(
        self, link: LoopLink, holders: list[tuple[str, Stored, dict[str, Any]]], now: float
    ) -> dict[str, int]:
        """Running jobs per queue: the holder lists' jobs, each once.

        An entry whose lease ran out is counted only if the job's record
        still says it runs under that list (its worker died and no rescue
        gave it back yet) or waits (a rescue giving it back right now: its
        pointer may not have been counted as ready).  An entry a process
        left behind for a job that finished (a claim that failed midway, a
        list write that was lost, a process that died) is not, whether or
        not any worker runs to tidy the list: one read per such entry."""
        counted: set[str] = set()
        running: dict[str, int] = {}
        expired: list[tuple[str, str, str]] = []
        for holder, _, content in holders:
            for jid, entry in content.get("run", {}).items():
                if float(entry[1]) < now:
                    expired.append((jid, str(entry[0]), holder))
                elif jid not in counted:
                    counted.add(jid)
                    running[str(entry[0])] = running.get(str(entry[0]), 0) + 1
        late = [x for x in expired if x[0] not in counted]
        if late:
            js = self.n.js
            recs = await link.store.read_many(
                self.n.jobs, [js + jid.encode() for jid, _, _ in late]
            )
            for (jid, queue, holder), rc in zip(late, recs, strict=True):
                rec = R.loads(rc.data) if rc is not None else {}
                st = rec.get(R.ST)
                live = st == R.RUNNING and rec.get(R.HOLDER) in (holder, None)
                if (live or st in R.WAITING) and jid not in counted:
                    counted.add(jid)
                    running[queue] = running.get(queue, 0) + 1
        return running

    async def _consumer_infos(
        self, link: LoopLink, keys: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, int, int] | None]:
        """(not yet delivered, delivered and not acked, first undelivered
        sequence) of each work consumer; None where it does not exist yet."""
        wire = link.wire
        futs = [
            wire.request(
                f"$JS.API.CONSUMER.INFO.{self.n.work}.{self.n.consumer(q, p)}".encode(), b""
            )
            for q, p in keys
        ]
        out: dict[tuple[str, int], tuple[int, int, int] | None] = {}
        for key, r in zip(keys, await wire.gather(futs), strict=True):
            out[key] = None
            if isinstance(r, Reply) and r.data:
                d = orjson.loads(r.data)
                if "error" not in d:
                    start = int((d.get("delivered") or {}).get("stream_seq", 0)) + 1
                    out[key] = (
                        int(d.get("num_pending", 0)),
                        int(d.get("num_ack_pending", 0)),
                        start,
                    )
        return out

    async def _ready(
        self,
        link: LoopLink,
        consumers: dict[tuple[str, int], tuple[int, int, int] | None],
        counts: dict[str, dict[int, int]],
        running: dict[str, int],
        now: float,
    ) -> tuple[dict[str, int], dict[str, float]]:
        """Per queue: jobs ready, and the age of the oldest ready pointer.

        Ready = pointers not delivered yet plus pointers delivered but not
        claimed (a fetch between pull and claim, a stash): the consumers'
        ``num_ack_pending`` less the claimed (running) jobs.  A level whose
        consumer does not exist yet (nobody fetched) counts its pointers."""
        wire = link.wire
        ready: dict[str, int] = {}
        unclaimed: dict[str, int] = {}
        firsts: list[tuple[str, asyncio.Future[Reply]]] = []
        path = b"$JS.API.DIRECT.GET." + self.n.work.encode()
        for (q, p), info in consumers.items():
            if info is None:
                pending, unacked, start = counts.get(q, {}).get(p, 0), 0, 1
            else:
                pending, unacked, start = info
            ready[q] = ready.get(q, 0) + pending
            unclaimed[q] = unclaimed.get(q, 0) + unacked
            if pending:
                body = orjson.dumps({"seq": start, "next_by_subj": self.n.pointer(q, p).decode()})
                firsts.append((q, wire.request(path, body)))
        for q, extra in unclaimed.items():
            ready[q] += max(0, extra - running.get(q, 0))
        lag: dict[str, float] = {}
        for (q, _), r in zip(firsts, await wire.gather([f for _, f in firsts]), strict=True):
            if isinstance(r, Reply):
                m = stored(r) if r.status in (0, 404) else None
                if m is not None:
                    lag[q] = max(lag.get(q, 0.0), now - m.time)
        return ready, lag

    async def _all(self, link: LoopLink) -> list[JobInfo]:
        """Every job in the index (a scan: admin listings without a narrower
        filter).  The fresh jobs' pointers are indexed first, so the scan
        sees every job (a pointer goes only after its record is written)."""
        await self._index_fresh(link, None)
        store = link.store
        states, fresh = await asyncio.gather(
            store.scan(self.n.jobs, self.n.js + b"*", last_per_subject=True),
            store.scan(self.n.jobs, self.n.je + b"*", last_per_subject=True),
        )
        now = self.clock.now()
        out: dict[str, JobInfo] = {}
        for m in states:
            info = R.info_of(R.loads(m.data), now)
            if info is not None:
                out[info.message.id] = info
            else:
                out[m.subject[len(self.n.js) :].decode()] = None  # type: ignore[assignment]
        for m in fresh:
            jid = m.subject[len(self.n.je) :].decode()
            if jid not in out and self._index_live(Stored(m.seq, m.subject, m.hdr, m.data)):
                try:
                    out[jid] = fresh_of(Stored(m.seq, m.subject, m.hdr, m.data), now)
                except MessageDecodeError:
                    continue
        return [i for i in out.values() if i is not None]

    async def _dead_letters(self, link: LoopLink) -> list[tuple[int, str, dict[str, Any]]]:
        """(DLQ sequence, job id, record) of every dead letter."""
        found = await link.store.scan(self.n.dlq, self.n.x + b"*")
        out = []
        for m in found:
            jid = (header(m.hdr, b"Dw-Id") or b"").decode()
            with contextlib.suppress(Exception):
                out.append((m.seq, jid, R.loads(m.data)))
        return out

    async def _matching(self, link: LoopLink, f: JobFilter) -> list[JobInfo]:
        if f.ids is not None:
            found = [await self._get(link, i) for i in f.ids]
            infos = [i for i in found if i is not None]
        elif f.state is State.RUNNING:
            seen: set[str] = set()
            for _, _, content in await self._holders(link):
                seen |= set(content.get("run", {}))
            found = [await self._get(link, i) for i in sorted(seen)]
            infos = [i for i in found if i is not None]
        elif f.state is State.DEAD:
            infos = []
            now = self.clock.now()
            for _, jid, rec in await self._dead_letters(link):
                info = await self._get(link, jid) or R.info_of(rec, now)
                if info is not None:
                    infos.append(info)
        else:
            infos = await self._all(link)
        return [i for i in infos if f.matches(i)]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        link = await self._link()
        return jobs_page(await self._matching(link, filter), cursor, limit)

    async def replay(self, filter: JobFilter) -> int:
        link = await self._link()
        n = 0
        for seq, jid, rec in await self._dead_letters(link):
            now = self.clock.now()
            subject = self.n.js + jid.encode()
            cur = await link.store.read(self.n.jobs, subject)
            old = R.loads(cur.data) if cur is not None else rec
            info = R.info_of(old, now)
            if info is None or info.state is not State.DEAD:
                # replayed (or purged) already: a replay that died after its
                # record write may not have published the pointer yet
                if cur is not None and old.get(R.ST) in R.WAITING:
                    await self._ensure_pointer(link, jid, old, cur.seq)
                await link.store.delete(self.n.dlq, seq)
                continue
            if not filter.matches(info):
                continue
            env = dict(old[R.ENV])
            env["attempt"] = 0
            new = {
                R.ST: State.READY.value, R.ENV: env, R.GEN: R.new_gen(), R.RUN_AT: now,
                R.UPDATED: now, R.REPLAYS: int(old.get(R.REPLAYS, 0)) + 1,
            }  # fmt: skip
            if R.RAW in old:  # an undecodable message: its copy carries the body again
                new[R.RAW] = old[R.RAW]
            try:
                ack = await link.store.put(subject, R.dumps(new), cur.seq if cur is not None else 0)
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
                continue
            await self._ensure_pointer(link, jid, new, ack.seq)
            await link.store.delete(self.n.dlq, seq)
            n += 1
        return n

    async def purge(self, filter: JobFilter) -> int:
        link = await self._link()
        infos = await self._matching(link, filter)
        dead = any(i.state is State.DEAD for i in infos)
        dlq = {jid: seq for seq, jid, _ in await self._dead_letters(link)} if dead else {}
        n = 0
        for info in infos:
            if info.state is State.RUNNING:
                continue
            jid = info.message.id

            def change(old: dict[str, Any], now: float) -> dict[str, Any] | None:
                if old.get(R.ST) == R.RUNNING:
                    return None
                return {**old, R.ST: R.PURGED, R.UPDATED: now, R.GEN: R.new_gen()}

            old = await self._set_state(link, jid, change)
            if old is None:
                continue
            st = old.get(R.ST)
            if st in R.WAITING:
                await self._unpoint(link, jid, old)
            elif st == State.DEAD.value and jid in dlq:
                await link.store.delete(self.n.dlq, dlq[jid])
            elif st in (State.SUCCEEDED.value, State.CANCELLED.value):
                ok = st == State.SUCCEEDED.value
                queue = str(old[R.ENV].get("queue", ""))
                link.holder.count(queue, -int(ok), -int(not ok), float(old.get(R.UPDATED, 0)))
            n += 1
        link.holder.write()
        await link.wire.flush()
        return n

    async def _set_state(self, link: LoopLink, jid: str, change: Any) -> dict[str, Any] | None:
        """Compare-and-set a job's record: ``change(old record, now)`` (a fresh
        job's index entry stands in for its record) returns the new record, or
        None to leave it.  Returns the old record when it changed."""
        subject = self.n.js + jid.encode()
        for _ in range(50):
            now = self.clock.now()
            cur, fresh = await self._lookup(link, jid)
            if cur is not None:
                old = R.loads(cur.data)
            elif fresh is not None:
                old = fresh_record(fresh, now)
            else:
                return None
            if old.get(R.ST) == R.PURGED:
                return None
            new = change(old, now)
            if new is None:
                return None
            try:
                await link.store.put(subject, R.dumps(new), cur.seq if cur is not None else 0)
                return old
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
        return None

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        link = await self._link()
        out = []
        for jid in ids:

            def change(old: dict[str, Any], now: float) -> dict[str, Any] | None:
                info = R.info_of(old, now)
                if info is None or info.state not in CANCELLABLE_STATES:
                    return None
                return {**old, R.ST: State.CANCELLED.value, R.UPDATED: now, R.GEN: R.new_gen()}

            old = await self._set_state(link, jid, change)
            if old is None:
                continue
            out.append(jid)
            await self._unpoint(link, jid, old)
            link.holder.count(str(old[R.ENV].get("queue", "")), 0, 1, self.clock.now())
        if out:
            link.holder.write()
            await link.wire.flush()
        return out

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        link = await self._link()
        at = self.clock.to_server(at)
        out = []
        for jid in ids:
            if await self._reschedule_one(link, jid, at):
                out.append(jid)
        return out

    async def _reschedule_one(self, link: LoopLink, jid: str, at: float) -> bool:
        """The record first, then its new pointer, then the old pointer out
        (as in ``_move``: a stale pointer repairs a missing one)."""
        subject = self.n.js + jid.encode()
        for _ in range(50):
            now = self.clock.now()
            cur, fresh = await self._lookup(link, jid)
            if cur is not None:
                old = R.loads(cur.data)
            elif fresh is not None:
                old = fresh_record(fresh, now)
            else:
                return False
            info = R.info_of(old, now)
            if info is None or info.state not in CANCELLABLE_STATES:
                return False
            env = old[R.ENV]
            state = R.waiting_state(int(env.get("attempt", 0)), at, now)
            new = {**old, R.ST: state, R.RUN_AT: at, R.UPDATED: now, R.GEN: R.new_gen()}
            try:
                ack = await link.store.put(subject, R.dumps(new), cur.seq if cur is not None else 0)
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
                continue
            await self._ensure_pointer(link, jid, new, ack.seq)
            await self._unpoint(link, jid, old)
            return True
        return False

    async def pause(self, queue: str) -> None:
        link = await self._link()
        await self._merge_config(link, b"paused", lambda p: sorted(set(p or []) | {queue}))
        await self._merge_config(link, b"queues", lambda q: sorted(set(q or []) | {queue}))
        link.paused = None

    async def resume(self, queue: str) -> None:
        link = await self._link()
        await self._merge_config(link, b"paused", lambda p: sorted(set(p or []) - {queue}))
        link.paused = None


def _work_subjects(
    n: Subjects, subjects: dict[bytes, int]
) -> tuple[dict[str, dict[int, int]], dict[tuple[str, bytes], int]]:
    """Pointer counts per queue and level, delay entries per (queue, kind)."""
    levels: dict[str, dict[int, int]] = {}
    delayed: dict[tuple[str, bytes], int] = {}
    for subject, count in subjects.items():
        parts = subject[len(n.base) :].split(b".")
        if len(parts) != 3:
            continue
        if parts[0] == b"w":
            levels.setdefault(untok(parts[1]), {})[prio_of(parts[2])] = count
        elif parts[0] == b"d":
            delayed[(untok(parts[1]), parts[2])] = count
    return levels, delayed
