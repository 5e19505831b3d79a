"""Claiming what a fetch pulled: each delivered pointer becomes a running
job by a compare-and-set on its job's record (its sequence is the
delivery's fencing token), sent pipelined for pointers that need no look
at the record first, one by one after a look for the others (a stale
pointer dropped, an early one held back, a job whose worker died rescued
or buried); docs/nats.md, "How a job moves".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ...errors import MessageDecodeError
from ...message import Message, from_dict
from ...state import State
from ..types import Delivery
from . import records as R
from .connection import LoopLink
from .moves import Moves
from .pointers import Ptr, lease_error, queue_of
from .protocol import JetStreamError, Reply, Unavailable, pub_ack
from .puller import Pulled
from .records import Token
from .store import Stored, cas_item, is_conflict
from .wire import ReplyBatch

log = logging.getLogger("dumbwaiter.nats")
_NS_PER_S = 1_000_000_000


class Claim(Moves):
    """Claims of delivered pointers (see the module doc)."""

    async def _claim_shielded(
        self, link: LoopLink, items: list[Pulled], lease: float, worker: str
    ) -> list[Delivery]:
        """Claim delivered pointers (see ``_claim``); if the fetch is cancelled
        meanwhile, give back what was claimed: a cancelled fetch leaves
        nothing leased.  No task of its own on the usual path: each event
        loop turn a fetch waits for is a turn behind every running job.

        What the claim listed as running and did not deliver leaves the list
        again, and the list is written: a pointer dropped as stale or held
        back, or given back by a cancelled fetch (the list used to keep those
        until the process' next write, and a worker idle afterwards left
        them behind: jobs shown running for good).  After a failure the
        claims' fate is unknown (a write may be stored with its answer
        lost): their jobs stay listed, marked for the next rescue to decide
        from their records (``_reconcile_own``)."""
        fast, slow, batch, now, until = self._claim_send(link, items, lease, worker)
        added = link.holder.added
        link.holder.added = {}
        out: list[Delivery] = []
        try:
            try:
                results = await asyncio.shield(batch.fut) if fast else []
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    out = self._claimed(link, fast, await batch.fut, slow, now, until, worker)
                    self._own(link, out, added, until)
                    await self.requeue(out)
                self._give_back(link, slow)
                self._unlist(link, added, {p.id for p in slow})
                raise
            out = self._claimed(link, fast, results, slow, now, until, worker)
            self._own(link, out, added, until)
            if slow:
                task = asyncio.ensure_future(
                    asyncio.gather(*(self._claim_slow(link, p, until, worker) for p in slow))
                )
                try:
                    got = await asyncio.shield(task)
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        claimed = [d for d in await task if d is not None]
                        self._own(link, claimed, added, until)
                        self._unlist(link, added, {p.id for p in slow} - {d.id for d in claimed})
                        await self.requeue(out + claimed)
                    raise
                claimed = [d for d in got if d is not None]
                self._own(link, claimed, added, until)
                out += claimed
                self._unlist(link, added, {p.id for p in slow} - {d.id for d in out})
        except BaseException:
            run = link.holder.run
            link.holder.unsure.update(j for j, e in added.items() if run.get(j) is e)
            link.holder.unsure.update(d.id for d in out if run.get(d.id) is d.token.entry)
            raise
        return out

    def _own(
        self, link: LoopLink, ds: list[Delivery], added: dict[str, list[Any]], until: float
    ) -> None:
        """Give each delivery its holder list entry (``Holder.owned``); a job
        listed already (by an earlier claim of this process) is listed anew,
        and the list written."""
        holder = link.holder
        anew = False
        for d in ds:
            listed = added.get(d.id)
            tok: Token = d.token
            tok.entry = holder.owned(d.id, d.queue or queue_of(d), until, listed)
            anew = anew or tok.entry is not listed
        if anew:
            holder.write()
            with contextlib.suppress(Exception):
                link.wire.write_now()

    def _unlist(self, link: LoopLink, added: dict[str, list[Any]], ids: set[str]) -> None:
        """Take out of the holder list the jobs this claim listed and did not
        deliver (``ids``), and write it."""
        gone = {jid: added[jid] for jid in ids if jid in added}
        if gone:
            link.holder.drop(gone)
            link.holder.write()
            with contextlib.suppress(Exception):
                link.wire.write_now()

    def _claim_send(
        self, link: LoopLink, items: list[Pulled], lease: float, worker: str
    ) -> tuple[list[tuple[Ptr, dict[str, Any], Message]], list[Ptr], ReplyBatch, float, float]:
        """Decode the pointers and send the claims of those that need no
        look at their record first: a compare-and-set that creates a fresh
        job's record, or rewrites it on the sequence its pointer names.  The
        holder list goes first (a crash in between lists a job that is not
        running: harmless).  A body that is not an envelope takes the slow
        way, whose record keeps it (``_claim_slow``)."""
        now = self.clock.now()
        until = now + lease
        fast: list[tuple[Ptr, dict[str, Any], Message]] = []
        slow: list[Ptr] = []
        paused = link.paused_now()
        for it in items:
            p = Ptr.of(it, self.n)
            if p.queue in paused:
                link.wire.publish(it.reply, b'-NAK {"delay":%d}' % _NS_PER_S)
                continue
            link.holder.running(p.id, p.queue, until)
            if p.env is not None and (p.gen == "0" or p.seq):
                env = dict(p.env)
                env["attempt"] = int(env.get("attempt", 0)) + 1
                try:
                    fast.append((p, env, from_dict(env)))
                    continue
                except MessageDecodeError as exc:
                    p.undecodable(str(exc))
            slow.append(p)
        if fast or slow:
            link.holder.write()
        js = self.n.js
        batch = link.wire.batch(
            [
                cas_item(
                    js + p.id.encode(),
                    R.dumps(
                        self._running(
                            p.gen, env, now, until, worker, p.reply, link, 0, now, p.replays
                        )
                    ),
                    p.seq,
                )
                for p, env, _ in fast
            ]
        )
        link.wire.write_now()
        return fast, slow, batch, now, until

    def _claimed(
        self,
        link: LoopLink,
        fast: list[tuple[Ptr, dict[str, Any], Message]],
        results: list[Reply],
        slow: list[Ptr],
        now: float,
        until: float,
        worker: str,
    ) -> list[Delivery]:
        """The deliveries whose claim won; the others join ``slow``."""
        out: list[Delivery] = []
        holder = link.holder.id
        for (p, _, m), r in zip(fast, results, strict=True):
            try:
                ack = pub_ack(r, "claim")
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
                slow.append(p)  # someone wrote the record first: look at it
                continue
            tok = Token(ack.seq, ack.seq, p.reply, p.gen, p.replays, now, holder, worker)
            out.append(Delivery(id=p.id, message=m, token=tok, lease_until=until, queue=p.queue))
        return out

    def _give_back(self, link: LoopLink, ps: list[Ptr]) -> None:
        """Hand unclaimed deliveries back to JetStream at once."""
        for p in ps:
            self._hold(link, p, 0.0)

    def _running(
        self,
        gen: str,
        env: dict[str, Any],
        now: float,
        until: float,
        worker: str,
        reply: bytes,
        link: LoopLink,
        claim: int,
        run_at: float,
        replays: int,
    ) -> dict[str, Any]:
        return {
            R.ST: R.RUNNING,
            R.ENV: env,
            R.GEN: gen,
            R.RUN_AT: run_at,
            R.UPDATED: now,
            R.WORKER: worker,
            R.LEASE: until,
            R.CLAIM: claim,
            R.ACK: reply.decode(),
            R.HOLDER: link.holder.id,
            R.REPLAYS: replays,
        }

    def _delivery(self, p: Ptr, env: dict[str, Any], tok: Token, until: float) -> Delivery:
        try:
            msg: Message | None = from_dict(env)
            err = None
        except MessageDecodeError as exc:
            msg, err = None, str(exc)
        return Delivery(
            id=p.id,
            message=msg,
            token=tok,
            lease_until=until,
            queue=p.queue,
            raw=None if msg is not None else p.data,
            decode_error=err,
        )

    async def _claim_slow(
        self, link: LoopLink, p: Ptr, until: float, worker: str
    ) -> Delivery | None:
        """Claim a pointer after looking at its job's record."""
        subject = self.n.js + p.id.encode()
        for _ in range(20):
            now = self.clock.now()
            cur = await link.store.read(self.n.jobs, subject)
            plan = await self._claim_plan(link, p, cur, now)
            if plan is None:
                return None
            env, replays, run_at, raw = plan
            rec = self._running(p.gen, env, now, until, worker, p.reply, link, 0, run_at, replays)
            kept = why = None
            if raw is not None:
                kept, why = self._kept_raw(link, raw, p.error)
                rec[R.RAW] = kept
            try:
                ack = await link.store.put(subject, R.dumps(rec), cur.seq if cur else 0)
            except JetStreamError as exc:
                if is_conflict(exc):
                    continue
                raise
            tok = Token(ack.seq, ack.seq, p.reply, p.gen, replays, run_at, link.holder.id, worker)
            if raw is not None:
                tok.raw, tok.env = kept, env
                return Delivery(
                    id=p.id,
                    message=None,
                    token=tok,
                    lease_until=until,
                    queue=p.queue,
                    raw=raw,
                    decode_error=why,
                )
            return self._delivery(p, env, tok, until)
        log.warning("nats: gave up claiming job %s (its record kept changing)", p.id)
        self._hold(link, p, 0.5)
        return None

    async def _claim_plan(
        self, link: LoopLink, p: Ptr, cur: Stored | None, now: float
    ) -> tuple[dict[str, Any], int, float, bytes | None] | None:
        """What claiming ``p`` means given its job's record: the envelope to
        run (attempt counted up), replays, run time and, for a message that is
        not an envelope, its body; or None after dropping a stale pointer or
        holding back one that comes early."""
        if cur is None:  # no record (yet, or any more: retention): the pointer has it all
            if p.env is None:
                return R.raw_env(p.id, p.queue, 1), p.replays, now, p.data
            env: dict[str, Any] = dict(p.env)
            env["attempt"] = int(env.get("attempt", 0)) + 1
            return env, p.replays, now, None
        old = R.loads(cur.data)
        st = old.get(R.ST)
        if old.get(R.GEN) != p.gen:
            if p.seq > cur.seq:
                # Not stale: this pointer was published after its record was
                # written at ``p.seq`` (every move writes the record first),
                # and this read is older than that: a replica behind its
                # leader answered the direct get.  Judged against that record
                # (a replay's: DEAD, the old generation) it would be dropped
                # and the job would never run.  Look again shortly.
                self._hold(link, p, 0.2)
                return None
            # a stale pointer: the job moved on.  If it waits, make sure its
            # own pointer exists (the mover may have died before publishing it)
            if st in R.WAITING:
                await self._ensure_pointer(link, p.id, old, cur.seq)
            self._drop(link, p)
            return None
        env = old[R.ENV]
        if st in R.WAITING:
            if float(old.get(R.RUN_AT, 0)) > now + 0.05:
                self._hold(link, p, float(old[R.RUN_AT]) - now)
                return None
        elif st == R.RUNNING:
            if float(old.get(R.LEASE, 0)) > now:  # its worker is alive: not ours
                self._hold(link, p, float(old[R.LEASE]) - now + 0.05)
                return None
            # JetStream redelivered it after AckWait: its worker died
            env.setdefault("errors", []).append(lease_error(old, now))
            if int(env.get("attempt", 0)) >= int(env.get("max_attempts", 1)):
                if await self._bury(link, old, cur.seq, now):
                    self._found_dead.append(R.dead_letter(env))
                return None
        else:
            if st == State.DEAD.value:  # finish a dead-lettering cut short
                await self._dlq_publish(link, old)
            self._drop(link, p)
            return None
        env["attempt"] = int(env.get("attempt", 0)) + 1
        raw = R.raw_of(old)
        if raw is None and p.env is None:
            raw = p.data
        return env, int(old.get(R.REPLAYS, 0)), float(old.get(R.RUN_AT, now)), raw

    @staticmethod
    def _kept_raw(link: LoopLink, raw: bytes, error: str | None) -> tuple[str, str]:
        """An undecodable body as its record keeps it (base64), and the reason
        the worker dead-letters it with.  The record must fit in one NATS
        message with its errors: a body longer than three eighths of the
        server's ``max_payload`` keeps its head, and the reason says so."""
        why = error or "message body is not a valid envelope"
        limit = link.wire.max_payload * 3 // 8
        if len(raw) > limit:
            why += f" (the body is {len(raw)} bytes; the first {limit} are kept)"
            raw = raw[:limit]
        return R.raw_field(raw), why

    def _drop(self, link: LoopLink, p: Ptr) -> None:
        with contextlib.suppress(Unavailable):
            link.wire.publish(p.reply, b"+ACK")

    def _hold(self, link: LoopLink, p: Ptr, seconds: float) -> None:
        with contextlib.suppress(Unavailable):
            link.wire.publish(p.reply, b'-NAK {"delay":%d}' % int(max(seconds, 0.001) * _NS_PER_S))
