"""A job's record and pointer moved together outside a worker's settle:
a pointer published for a record (or made sure of after a crash), a waiting
job's pointer taken out, a job given back when its claim never reached a
worker or buried when it lost its worker out of attempts, and a
connection's holder list tidied of jobs no longer running there.

Where a record and a pointer both change, the record goes first, then the
pointer, then the ``+ACK`` of the old delivery: a process dying in between
leaves something the next fetch or rescue repairs.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson

from ...state import State
from . import records as R
from .connection import LoopLink
from .index import Index
from .pointers import _duplicate_of
from .protocol import JetStreamError, Reply, Unavailable, headers, pub_ack
from .store import is_conflict, stored


class Moves(Index):
    """Pointer publishing and removal, give-backs (see the module doc)."""

    def _repoint_req(
        self,
        link: LoopLink,
        jid: str,
        queue: str,
        env: dict[str, Any],
        gen: str,
        at: float,
        now: float,
        seq: int = 0,
        replays: int = 0,
        raw: bytes | None = None,
    ) -> asyncio.Future[Reply]:
        """Publish a job's pointer for generation ``gen`` (its record, at
        sequence ``seq``, was written first): to the work subjects if due,
        else a delay entry.  Its ``Nats-Msg-Id`` makes publishing it twice
        harmless (``_ensure_pointer``).  An undecodable message's pointer
        carries its kept body (``raw``), marked, instead of an envelope."""
        body = orjson.dumps(env) if raw is None else raw
        prio = int(env.get("priority", 0))
        pairs: list[tuple[bytes, bytes | str | int | float]] = [
            (b"Nats-Msg-Id", jid if gen == "0" else f"{jid}:{gen}"),
            (b"Dw-Id", jid),
            (b"Dw-G", gen),
            (b"Dw-S", seq),
        ]
        if replays:
            pairs.append((b"Dw-Rp", replays))
        if raw is not None:
            pairs.append((b"Dw-Raw", b"1"))
        if at > now + 0.001:
            kind = b"r" if int(env.get("attempt", 0)) > 0 else b"s"
            pairs += [(b"Dw-P", prio), (b"Dw-At", repr(at))]
            return link.wire.request(self.n.delayed(queue, kind), body, headers(*pairs))
        if prio:
            link.level_seen(queue, prio)
        return link.wire.request(self.n.pointer(queue, prio), body, headers(*pairs))

    async def _ensure_pointer(
        self, link: LoopLink, jid: str, rec: dict[str, Any], seq: int
    ) -> None:
        """Publish the pointer a waiting record expects, unless it exists (its
        ``Nats-Msg-Id`` is still in the de-duplication window): the repair
        after a process died between writing a record and its pointer."""
        env = rec.get(R.ENV) or {}
        now = self.clock.now()
        at = float(rec.get(R.RUN_AT) or now)
        fut = self._repoint_req(
            link, jid, str(env.get("queue", "")), env, str(rec.get(R.GEN, "0")), at, now,
            seq, int(rec.get(R.REPLAYS, 0)), R.raw_of(rec),
        )  # fmt: skip
        pub_ack(await self._await(link, fut), "pointer")

    async def _dlq_publish(
        self, link: LoopLink, rec: dict[str, Any], jid: str | None = None
    ) -> None:
        """Put a dead job's record into the DLQ stream (idempotent per generation)."""
        env = rec.get(R.ENV) or {}
        jid = jid or str(env.get("id", ""))
        queue = str(env.get("queue", "") or "?")
        await link.store.put(
            self.n.dead(queue),
            R.dumps(rec),
            None,
            ((b"Nats-Msg-Id", f"dead:{jid}:{rec.get(R.GEN)}"), (b"Dw-Id", jid)),
        )

    async def _reconcile_own(self, link: LoopLink, every: bool = False) -> None:
        """Take out of this connection's holder list the jobs it lists as
        running that are not running here by their records: claims that
        failed midway (``Holder.unsure``), entries whose lease ran out, and,
        with ``every`` (a closing connection), all of them.

        A job stays listed while its record is running under this list (a
        rescuer gives it back once its lease runs out: the list is how it is
        found), except after a failed claim: that claim's write was stored
        but its delivery never reached the worker, so nobody runs the job,
        and it is given back now (``_unclaim``) rather than a lease later.
        Anything else (the job finished or waits, whoever did it) goes; a
        settle of this list's whose count was never made (the list that
        counts it, ``SETTLED_BY``, is this one) is counted now, as a rescuer
        counts it for a process that died.  Without this, an entry left by a
        failed claim stayed as long as the process lived, written again with
        every list it wrote (a rescuer tidying the stored list cannot reach
        the process' memory), and was left behind at exit: ``stats`` showed
        jobs running that had finished long before."""
        h = link.holder
        now = self.clock.now()
        check = {
            jid: e
            for jid, e in h.run.items()
            if (every or jid in h.unsure or float(e[1]) < now) and jid not in h.settling
        }
        failed = h.unsure & set(check)
        h.unsure -= set(check)
        if not check:
            return
        js = self.n.js
        recs = await link.store.read_many(self.n.jobs, [js + jid.encode() for jid in check])
        dropped = False
        for (jid, e), rc in zip(check.items(), recs, strict=True):
            rec = R.loads(rc.data) if rc is not None else {}
            st = rec.get(R.ST)
            if h.run.get(jid) is not e or jid in h.settling:
                continue  # claimed again, or a settle began, while we read
            if st == R.RUNNING and rec.get(R.HOLDER) == h.id:
                if jid not in failed:
                    continue
                assert rc is not None
                if not await self._unclaim(link, rec, rc.seq, now):
                    h.unsure.add(jid)  # it changed meanwhile: look again next time
                    continue
            # out and counted in one step: a settle retried after this finds
            # the job gone from the list and does not count it again
            h.drop({jid: e})
            dropped = True
            if rec.get(R.SETTLED_BY) == h.id:
                if st == State.SUCCEEDED.value:
                    h.count(str(e[0]), 1, 0, now)
                elif st == State.DEAD.value:
                    await self._dlq_publish(link, rec)
                if rec.get(R.ACK):  # the settle may not have got that far either
                    with contextlib.suppress(Unavailable):
                        link.wire.publish(str(rec[R.ACK]).encode(), b"+ACK")
        if dropped:
            h.write()
            await link.wire.flush()

    async def _unclaim(self, link: LoopLink, rec: dict[str, Any], seq: int, now: float) -> bool:
        """Give back a job whose claim (record at ``seq``) was stored but never
        delivered: ready again at once, the attempt the claim counted
        returned, as a requeue does.  Record first, then its pointer, then
        ``+ACK`` the pointer the claim took.  False if the record changed
        meanwhile (the compare-and-set on ``seq`` lost)."""
        env = dict(rec[R.ENV])
        env["attempt"] = max(0, int(env.get("attempt", 0)) - 1)
        return await self._ready_again(link, rec, env, seq, now)

    async def _ready_again(
        self, link: LoopLink, rec: dict[str, Any], env: dict[str, Any], seq: int, now: float
    ) -> bool:
        """Store the record at ``seq`` as ready now with ``env``, then its new
        pointer, then ``+ACK`` the delivery it held (an unclaim, a rescue).
        False if the record changed meanwhile (the compare-and-set lost)."""
        jid = str(env["id"])
        new = {
            R.ST: State.READY.value,
            R.ENV: env,
            R.GEN: R.new_gen(),
            R.RUN_AT: now,
            R.UPDATED: now,
            R.WORKER: rec.get(R.WORKER),
            R.BY: R.claim_of(rec, seq),
            R.REPLAYS: rec.get(R.REPLAYS, 0),
        }
        if R.RAW in rec:
            new[R.RAW] = rec[R.RAW]
        try:
            ack = await link.store.put(self.n.js + jid.encode(), R.dumps(new), seq)
        except JetStreamError as exc:
            if is_conflict(exc):
                return False
            raise
        await self._ensure_pointer(link, jid, new, ack.seq)
        if rec.get(R.ACK):
            with contextlib.suppress(Unavailable):
                link.wire.publish(str(rec[R.ACK]).encode(), b"+ACK")
        return True

    async def _bury(self, link: LoopLink, rec: dict[str, Any], seq: int, now: float) -> bool:
        """A job out of attempts after losing its worker: dead-letter it."""
        rec = {**rec, R.ST: State.DEAD.value, R.UPDATED: now, R.BY: R.claim_of(rec, seq)}
        reply = str(rec.pop(R.ACK, "") or "")
        rec.pop(R.LEASE, None)
        try:
            await link.store.put(self.n.js + str(rec[R.ENV]["id"]).encode(), R.dumps(rec), seq)
        except JetStreamError as exc:
            if is_conflict(exc):
                return False
            raise
        await self._dlq_publish(link, rec)
        if reply:
            with contextlib.suppress(Unavailable):
                link.wire.publish(reply.encode(), b"+ACK")
        return True

    async def _unpoint(self, link: LoopLink, jid: str, old: dict[str, Any]) -> None:
        """Take a waiting job's pointer (or delay entry) out of the work stream,
        so the counts stay exact after a cancel, purge or reschedule.

        The pointer is found by its ``Nats-Msg-Id`` (a publish that can never
        be stored, with that id, answers "duplicate of sequence N" while the
        id is inside the de-duplication window); older than that, by time."""
        gen = str(old.get(R.GEN, "0"))
        ids = [f"{jid}:{gen}:due", jid if gen == "0" else f"{jid}:{gen}"]
        futs = [self._probe_req(link, mid.encode()) for mid in ids]
        seqs = []
        for r in await link.wire.gather(futs):
            if isinstance(r, Reply) and (seq := _duplicate_of(r)):
                seqs.append(seq)
        for seq in seqs:
            await link.store.delete(self.n.work, seq)
        if seqs:
            return
        env = old.get(R.ENV) or {}
        queue, prio = str(env.get("queue", "")), int(env.get("priority", 0))
        when = float(old.get(R.UPDATED) or self.clock.now())
        ra = float(old.get(R.RUN_AT) or when)
        for subject, around in (
            (self.n.pointer(queue, prio), max(when, ra)),
            (self.n.pointer(queue, prio), when),
            (self.n.delayed(queue, b"s"), when),
            (self.n.delayed(queue, b"r"), when),
        ):
            found = await self._find(link, subject, jid, around)
            if found:
                await link.store.delete(self.n.work, found)
                return

    async def _find(self, link: LoopLink, subject: bytes, jid: str, around: float) -> int | None:
        """The sequence of job ``jid``'s message on ``subject``, published
        near ``around``: a binary search by time, then a short walk."""
        info = await link.wire.api(f"STREAM.INFO.{self.n.work}")
        lo = int(info["state"].get("first_seq", 1))
        hi = int(info["state"].get("last_seq", 0))
        path = b"$JS.API.DIRECT.GET." + self.n.work.encode()
        sub = subject.decode()
        while lo < hi:
            mid = (lo + hi) // 2
            m = stored(await link.wire.call(path, orjson.dumps({"seq": mid, "next_by_subj": sub})))
            if m is None or m.time >= around - 2.0:
                hi = mid
            else:
                lo = m.seq + 1
        async for m in link.store.walk(self.n.work, subject, lo):
            if (m.get(b"Dw-Id") or b"").decode() == jid:
                return m.seq
            if m.time > around + 30.0:
                break
        return None
