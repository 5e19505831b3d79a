"""The admin part of the NATS broker: stats, listings, replay, purge, cancel,
reschedule, pause and resume.

Counts come from JetStream's own bookkeeping, never from reading jobs:
ready from the work consumers, scheduled and retrying from the delay
subjects, dead from the DLQ stream, running and finished from the holders'
lists.  Listings read the job index (a scan), except running (the holders)
and dead (the DLQ).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import BrokerError, MessageDecodeError
from ...state import CANCELLABLE_STATES, State
from ..base import (
    JobFilter,
    JobInfo,
    Page,
    QueueStats,
)
from . import records as R
from .core import (
    Core,
    fresh_of,
    fresh_record,
)
from .link import Link
from .names import prio_of, untok
from .store import Stored, is_conflict, stored
from .wire import (
    JetStreamError,
    Reply,
    header,
    pub_ack,
)


class Admin(Core):
    async def get(self, id: str) -> JobInfo | None:
        return await self._get(await self._link(), id)

    async def stats(self) -> list[QueueStats]:
        link = await self._link()
        n = self.n
        store = link.store
        work, dead, holders, declared, paused = await asyncio.gather(
            store.subjects(n.work, n.base + b"*.>"),
            store.subjects(n.dlq, n.x + b"*"),
            self._holders(link),
            self._config(link, b"queues"),
            self._config(link, b"paused"),
        )
        now = time.time()
        queues: set[str] = set(declared or []) | set(paused or [])
        levels: dict[str, dict[int, int]] = {}
        delayed: dict[tuple[str, bytes], int] = {}
        for subject, count in work.items():
            parts = subject[len(n.base) :].split(b".")
            if parts[0] == b"w" and len(parts) == 3:
                q = untok(parts[1])
                levels.setdefault(q, {})[prio_of(parts[2])] = count
                queues.add(q)
            elif parts[0] == b"d" and len(parts) == 3:
                q = untok(parts[1])
                delayed[(q, parts[2])] = count
                queues.add(q)
        dead_by = {untok(s[len(n.x) :]): c for s, c in dead.items()}
        queues |= set(dead_by)
        running: dict[str, int] = {}
        fin: dict[str, list[int]] = {}
        oldest = str(int((now - self.retention) // 60))
        for _, _, content in holders:
            for entry in content.get("run", {}).values():
                running[str(entry[0])] = running.get(str(entry[0]), 0) + 1
            for q, buckets in content.get("fin", {}).items():
                f = fin.setdefault(q, [0, 0])
                for minute, (ok, cx) in buckets.items():
                    if minute >= oldest:
                        f[0] += ok
                        f[1] += cx
        queues |= set(running) | set(fin)
        ready_lag = await self._ready(link, levels, running, now)
        out = []
        for q in sorted(queues):
            ready, lag = ready_lag.get(q, (0, 0.0))
            f = fin.get(q, [0, 0])
            out.append(
                QueueStats(
                    queue=q,
                    ready=ready,
                    scheduled=delayed.get((q, b"s"), 0),
                    retrying=delayed.get((q, b"r"), 0),
                    running=running.get(q, 0),
                    dead=dead_by.get(q, 0),
                    succeeded=f[0],
                    cancelled=f[1],
                    lag=lag,
                    paused=q in (paused or []),
                )
            )
        return out

    async def _ready(
        self,
        link: Link,
        levels: dict[str, dict[int, int]],
        running: dict[str, int],
        now: float,
    ) -> dict[str, tuple[int, float]]:
        """Per queue: jobs ready, and the age of the oldest ready pointer.

        Ready = pointers not delivered yet (``num_pending``) plus pointers
        delivered but not claimed (a fetch between pull and claim, a stash):
        the consumers' ``num_ack_pending`` less the claimed (running) jobs.
        So a job is counted somewhere at every moment of a fetch."""
        wire = link.wire
        keys = [(q, p) for q, lv in levels.items() for p in lv]
        futs = [
            wire.request(
                f"$JS.API.CONSUMER.INFO.{self.n.work}.{self.n.consumer(q, p)}".encode(), b""
            )
            for q, p in keys
        ]
        infos = await wire.gather(futs)
        firsts: list[asyncio.Future[Reply] | None] = []
        pending: dict[str, int] = {}
        delivered: dict[str, int] = {}
        for (q, p), r in zip(keys, infos, strict=True):
            start, count, unacked = 1, levels[q][p], 0
            if isinstance(r, Reply):
                d = orjson.loads(r.data) if r.data else {}
                if "error" not in d:
                    count = int(d.get("num_pending", 0))
                    unacked = int(d.get("num_ack_pending", 0))
                    start = int((d.get("delivered") or {}).get("stream_seq", 0)) + 1
            pending[q] = pending.get(q, 0) + count
            delivered[q] = delivered.get(q, 0) + unacked
            firsts.append(
                wire.request(
                    b"$JS.API.DIRECT.GET." + self.n.work.encode(),
                    orjson.dumps({"seq": start, "next_by_subj": self.n.pointer(q, p).decode()}),
                )
                if count
                else None
            )
        await wire.flush()
        lags: dict[str, float] = {}
        for (q, _), f in zip(keys, firsts, strict=True):
            if f is None:
                continue
            try:
                m = stored(await f)
            except BrokerError:
                m = None
            if m is not None:
                lags[q] = max(lags.get(q, 0.0), now - m.time)
        return {
            q: (pending[q] + max(0, delivered[q] - running.get(q, 0)), max(lags.get(q, 0.0), 0.0))
            for q in pending
        }

    async def _all(self, link: Link) -> list[JobInfo]:
        """Every job in the index (a scan: admin listings without a narrower filter)."""
        store = link.store
        states, fresh = await asyncio.gather(
            store.scan(self.n.jobs, self.n.js + b"*", last_per_subject=True),
            store.scan(self.n.jobs, self.n.je + b"*", last_per_subject=True),
        )
        now = time.time()
        out: dict[str, JobInfo] = {}
        for m in states:
            info = R.info_of(R.loads(m.data), now)
            if info is not None:
                out[info.message.id] = info
            else:
                out[m.subject[len(self.n.js) :].decode()] = None  # type: ignore[assignment]
        for m in fresh:
            jid = m.subject[len(self.n.je) :].decode()
            if jid not in out:
                try:
                    out[jid] = fresh_of(Stored(m.seq, m.subject, m.hdr, m.data), now)
                except MessageDecodeError:
                    continue
        return [i for i in out.values() if i is not None]

    async def _dead_letters(self, link: Link) -> list[tuple[int, str, dict[str, Any]]]:
        """(DLQ sequence, job id, record) of every dead letter."""
        found = await link.store.scan(self.n.dlq, self.n.x + b"*")
        out = []
        for m in found:
            jid = (header(m.hdr, b"Dw-Id") or b"").decode()
            with contextlib.suppress(Exception):
                out.append((m.seq, jid, R.loads(m.data)))
        return out

    async def _matching(self, link: Link, f: JobFilter) -> list[JobInfo]:
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
            now = time.time()
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
        rows = sorted(await self._matching(link, filter), key=lambda i: i.message.id, reverse=True)
        if cursor is not None:
            rows = [i for i in rows if i.message.id < cursor]
        page = rows[:limit]
        more = len(rows) > limit
        return Page(items=page, cursor=page[-1].message.id if more and page else None)

    async def replay(self, filter: JobFilter) -> int:
        link = await self._link()
        n = 0
        for seq, jid, rec in await self._dead_letters(link):
            now = time.time()
            subject = self.n.js + jid.encode()
            cur = await link.store.read(self.n.jobs, subject)
            old = R.loads(cur.data) if cur is not None else rec
            info = R.info_of(old, now)
            if info is None or info.state is not State.DEAD or not filter.matches(info):
                if info is None or info.state is not State.DEAD:
                    await link.store.delete(self.n.dlq, seq)  # replayed or purged already
                continue
            env = dict(old[R.ENV])
            env["attempt"] = 0
            gen = R.new_gen()
            queue = str(env.get("queue", ""))
            new = {
                R.ST: State.READY.value, R.ENV: env, R.GEN: gen, R.RUN_AT: now,
                R.UPDATED: now, R.REPLAYS: int(old.get(R.REPLAYS, 0)) + 1,
            }  # fmt: skip
            fut = self._repoint_req(link, jid, queue, env, gen, now, now)
            pointer = pub_ack(await self._await(link, fut), "replay").seq
            try:
                await link.store.put(subject, R.dumps(new), cur.seq if cur is not None else 0)
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
                await link.store.delete(self.n.work, pointer)
                continue
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

    async def _set_state(self, link: Link, jid: str, change: Any) -> dict[str, Any] | None:
        """Compare-and-set a job's record: ``change(old record, now)`` (a fresh
        job's index entry stands in for its record) returns the new record, or
        None to leave it.  Returns the old record when it changed."""
        subject = self.n.js + jid.encode()
        for _ in range(50):
            now = time.time()
            cur, fresh = await link.store.read_many(
                self.n.jobs, [subject, self.n.je + jid.encode()]
            )
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
            link.holder.count(str(old[R.ENV].get("queue", "")), 0, 1, time.time())
        if out:
            link.holder.write()
            await link.wire.flush()
        return out

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        link = await self._link()
        out = []
        for jid in ids:
            if await self._reschedule_one(link, jid, at):
                out.append(jid)
        return out

    async def _reschedule_one(self, link: Link, jid: str, at: float) -> bool:
        """The new pointer first, then the record (as in ``_move``); a pointer
        whose record write lost is deleted again."""
        subject = self.n.js + jid.encode()
        for _ in range(50):
            now = time.time()
            cur, fresh = await link.store.read_many(
                self.n.jobs, [subject, self.n.je + jid.encode()]
            )
            if cur is not None:
                old = R.loads(cur.data)
            elif fresh is not None:
                old = fresh_record(fresh, now)
            else:
                return False
            info = R.info_of(old, now)
            if info is None or info.state not in CANCELLABLE_STATES:
                return False
            gen = R.new_gen()
            env = old[R.ENV]
            fut = self._repoint_req(link, jid, str(env.get("queue", "")), env, gen, at, now)
            seq = pub_ack(await self._await(link, fut), "reschedule").seq
            state = R.waiting_state(int(env.get("attempt", 0)), at, now)
            new = {**old, R.ST: state, R.RUN_AT: at, R.UPDATED: now, R.GEN: gen}
            try:
                await link.store.put(subject, R.dumps(new), cur.seq if cur is not None else 0)
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
                await link.store.delete(self.n.work, seq)
                continue
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
