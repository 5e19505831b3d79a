"""The worker side of the NATS broker: ``fetch`` (pull, then claim each
pointer by writing its job's record), ``ack``, ``retry``, ``dead``,
``requeue`` and ``extend`` (a compare-and-set on the record, then the
pointer's ``+ACK``); docs/nats.md, "Fetch and claim".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from ...errors import MessageDecodeError
from ...message import Message, from_dict
from ...state import State
from ..base import (
    Delivery,
)
from . import records as R
from .connection import LoopLink
from .coordination import Coordination
from .pointers import (
    Ptr,
    env_of,
    lease_error,
    queue_of,
)
from .protocol import (
    JetStreamError,
    Reply,
    Unavailable,
    pub_ack,
)
from .puller import SETTLE, Pulled
from .records import Token
from .store import Stored, cas_item, is_conflict
from .wire import ReplyBatch

log = logging.getLogger("dumbwaiter.nats")
_NS_PER_S = 1_000_000_000


class Transport(Coordination):
    """The worker side (see the module doc)."""

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0 or not queues:
            return []
        link = await self._link()
        deadline = time.monotonic() + wait
        if wait > 0 and not link.wire.connected:
            # nats-py is connecting anew in the background: a blocking fetch
            # waits for that as it waits for a job.  Raising at once instead
            # sent the worker into its backoff (up to 5 s between fetches
            # after a long outage), and a host back from a network cut sat
            # out that much more after it had reconnected.  The loss itself
            # was raised by the fetch it interrupted, and logged.
            if not await link.wire.wait_connected(wait):
                return []
        link.start_promoter()
        out: list[Delivery] = []
        woke = False
        while True:
            plan = await link.plan(queues)
            for puller in plan:
                need = limit - len(out)
                if need <= 0:
                    break
                # what a long poll brought is claimed at once: another pull
                # first would cost a round trip of latency (the worker fetches
                # again for more as soon as it has started these).  A fetch
                # that will not long-poll gives the server SETTLE s to see a
                # message it has just stored (see puller.SETTLE).
                items = (
                    puller.take(need)
                    if woke
                    else await puller.pull(need, SETTLE if wait <= 0 else 0.0)
                )
                if items:
                    out += await self._claim_shielded(link, items, lease, worker)
            if out or wait <= 0:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            if not woke or not any(p.stash for p in plan):
                # nothing ready: park a one-message request on every level
                # and wake at the first delivery (claimed from the stash)
                waits = [p.request(1, remaining) for p in plan]
                await link.wire.flush()
                done, _ = await asyncio.wait(
                    waits, timeout=remaining + 1.0, return_when=asyncio.FIRST_COMPLETED
                )
                if not link.wire.connected:
                    raise Unavailable("the connection to NATS was lost during a fetch")
                if not done:
                    return out
            woke = any(p.stash for p in plan)

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
                    await self.requeue(out)
                self._give_back(link, slow)
                self._unlist(link, added, {p.id for p in slow})
                raise
            out = self._claimed(link, fast, results, slow, now, until, worker)
            if slow:
                task = asyncio.ensure_future(
                    asyncio.gather(*(self._claim_slow(link, p, until, worker) for p in slow))
                )
                try:
                    got = await asyncio.shield(task)
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        claimed = [d for d in await task if d is not None]
                        self._unlist(link, added, {p.id for p in slow} - {d.id for d in claimed})
                        await self.requeue(out + claimed)
                    raise
                out += [d for d in got if d is not None]
                self._unlist(link, added, {p.id for p in slow} - {d.id for d in out})
        except BaseException:
            link.holder.unsure.update(j for j, e in added.items() if link.holder.run.get(j) is e)
            raise
        if len(added) < len(out):  # a job listed already (a claim's leftover) is now ours
            for d in out:
                if d.id not in added:
                    link.holder.unsure.discard(d.id)
                    link.holder.extended(d.id, until)
        return out

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

    async def ack(self, ds: Sequence[Delivery]) -> None:
        now = self.clock.now()

        def final(d: Delivery, tok: Token) -> dict[str, Any]:
            rec = self._settled(d, tok, State.SUCCEEDED.value, now)
            if d.result is not None:
                rec[R.RESULT] = d.result.decode()
            return rec

        done = await self._settle(ds, final, "ok")
        long = [
            d for d in done
            if d.result is not None and d.result_ttl and d.result_ttl > self.retention
        ]  # fmt: skip
        if long:
            link = await self._link()
            for d in long:
                assert isinstance(d.token, Token) and d.result_ttl is not None
                rec = final(d, d.token)
                await self._kv_put_raw(
                    link, self.n.c + b"res." + d.id.encode(), R.dumps(rec), d.result_ttl
                )

    async def retry(self, ds: Sequence[Delivery]) -> None:
        now = self.clock.now()
        moves: dict[str, tuple[str, float]] = {}

        def waiting(d: Delivery, tok: Token) -> dict[str, Any]:
            gen, at = moves[d.id]
            env = env_of(d)
            if d.error is not None:
                env.setdefault("errors", []).append(d.error.to_dict())
            attempt = int(env.get("attempt", 0))
            rec = self._settled(d, tok, R.waiting_state(attempt, at, now), now, env)
            rec[R.GEN], rec[R.RUN_AT] = gen, at
            return rec

        await self._move(
            ds, moves, waiting, lambda d: max(self.clock.to_server(d.retry_at), now), now
        )

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        now = self.clock.now()
        moves: dict[str, tuple[str, float]] = {}

        def waiting(d: Delivery, tok: Token) -> dict[str, Any]:
            gen, at = moves[d.id]
            env = env_of(d)
            env["attempt"] = max(0, int(env.get("attempt", 0)) - 1)
            rec = self._settled(d, tok, R.waiting_state(int(env["attempt"]), at, now), now, env)
            rec[R.GEN], rec[R.RUN_AT] = gen, at
            return rec

        await self._move(
            ds, moves, waiting, lambda d: max(self.clock.to_server(d.retry_at), now), now
        )

    async def dead(self, ds: Sequence[Delivery]) -> None:
        now = self.clock.now()

        def buried(d: Delivery, tok: Token) -> dict[str, Any]:
            env = env_of(d)
            if d.error is not None:
                env.setdefault("errors", []).append(d.error.to_dict())
            return self._settled(d, tok, State.DEAD.value, now, env)

        await self._settle(ds, buried, "dead")

    def _settled(
        self, d: Delivery, tok: Token, state: str, now: float, env: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        rec = {
            R.ST: state,
            R.ENV: env if env is not None else env_of(d),
            R.GEN: tok.gen,
            R.RUN_AT: tok.run_at,
            R.UPDATED: now,
            R.WORKER: tok.worker,
            R.BY: tok.claim,
            R.HOLDER: tok.holder,
            R.REPLAYS: tok.replays,
            R.ACK: tok.reply.decode(),
        }
        if tok.raw is not None:
            rec[R.RAW] = tok.raw
        return rec

    async def _move(
        self,
        ds: Sequence[Delivery],
        moves: dict[str, tuple[str, float]],
        build: Any,
        when: Any,
        now: float,
    ) -> None:
        """Retry or requeue: move each job's record to its next run (a new
        generation), then publish the pointer (or delay entry) of that
        generation, then ``+ACK`` the old pointer.  A process dying in between
        leaves the old pointer unacked: JetStream redelivers it, and the fetch
        that finds it stale publishes the missing pointer (``_claim_slow``)."""
        held = [d for d in ds if isinstance(d.token, Token)]
        if not held:
            return
        for d in held:
            moves[d.id] = (R.new_gen(), when(d))
        link = await self._link()
        written, lost = await self._rewrite(link, held, build)
        futs = []
        for d, rec, seq in written:
            gen, at = moves[d.id]
            futs.append(
                self._repoint_req(
                    link,
                    d.id,
                    d.queue or queue_of(d),
                    rec[R.ENV],
                    gen,
                    at,
                    now,
                    seq,
                    int(rec.get(R.REPLAYS, 0)),
                    R.raw_of(rec),
                )
            )
        for r in await link.wire.gather(futs):
            if isinstance(r, BaseException):
                raise r
            pub_ack(r, "pointer")
        for d, _, _ in written:
            with contextlib.suppress(Unavailable):
                link.wire.publish(d.token.reply, b"+ACK")
            link.holder.finished(d.id, d.queue or queue_of(d), None)
        if lost:
            link.holder.forget({d.id for d in lost})
        link.holder.write()
        await link.wire.flush()

    async def _rewrite(
        self, link: LoopLink, ds: list[Delivery], build: Any
    ) -> tuple[list[tuple[Delivery, dict[str, Any], int]], list[Delivery]]:
        """Compare-and-set each delivery's record to ``build(d, token)`` on its
        token; returns (written: delivery, record, new sequence) and the
        deliveries whose lease was lost.

        A conflict is looked at before it counts as a lost lease: the record
        still running under our claim (a heartbeat came in between, or our
        own write whose reply was lost) is written again on its current
        sequence, and a record our claim already moved to the same state
        (a retried settle) is done."""
        store = link.store
        written: list[tuple[Delivery, dict[str, Any], int]] = []
        lost: list[Delivery] = []
        todo = ds
        for _ in range(10):
            recs = [build(d, d.token) for d in todo]
            batch = link.wire.batch(
                [
                    cas_item(self.n.js + d.id.encode(), R.dumps(rec), d.token.seq)
                    for d, rec in zip(todo, recs, strict=True)
                ]
            )
            await link.wire.flush()
            check: list[tuple[Delivery, dict[str, Any]]] = []
            for d, rec, r in zip(todo, recs, await batch.wait(), strict=True):
                try:
                    written.append((d, rec, pub_ack(r, "settle").seq))
                except JetStreamError as exc:
                    if not is_conflict(exc):
                        raise
                    check.append((d, rec))
            if not check:
                break
            curs = await store.read_many(self.n.jobs, [self.n.js + d.id.encode() for d, _ in check])
            again: list[Delivery] = []
            for (d, rec), cur in zip(check, curs, strict=True):
                tok: Token = d.token
                old = R.loads(cur.data) if cur is not None else {}
                if old.get(R.ST) == R.RUNNING and cur and R.claim_of(old, cur.seq) == tok.claim:
                    tok.seq = cur.seq  # still ours: write again
                    again.append(d)
                elif cur and old.get(R.BY) == tok.claim and old.get(R.ST) == rec[R.ST]:
                    written.append((d, rec, cur.seq))  # our own earlier write
                else:
                    lost.append(d)
            if not again:
                break
            todo = again
        return written, lost

    async def _settle(
        self, ds: Sequence[Delivery], build: Any, count: str | None
    ) -> list[Delivery]:
        """Write each delivery's final record (compare-and-set on its token),
        then ``+ACK`` its pointer; a delivery whose lease was lost is ignored.
        Returns the deliveries that settled."""
        held = [d for d in ds if isinstance(d.token, Token)]
        if not held:
            return []
        link = await self._link()
        holder = link.holder

        def settled(d: Delivery, tok: Token) -> dict[str, Any]:
            rec: dict[str, Any] = build(d, tok)
            rec[R.SETTLED_BY] = holder.id  # this list counts it (see rescue)
            return rec

        ids = {d.id for d in held}
        holder.settling |= ids
        try:
            written, lost = await self._rewrite(link, held, settled)
            for d, rec, _ in written:
                if count == "dead":
                    await self._dlq_publish(link, rec, d.id)
                with contextlib.suppress(Unavailable):
                    link.wire.publish(d.token.reply, b"+ACK")
                link.holder.finished(d.id, d.queue or queue_of(d), count)
        finally:
            holder.settling -= ids
        if lost:
            link.holder.forget({d.id for d in lost})
        link.holder.write()
        await link.wire.flush()
        return [d for d, _, _ in written]

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        held = [d for d in ds if isinstance(d.token, Token)]
        lost = [d for d in ds if not isinstance(d.token, Token)]
        if not held:
            return lost
        link = await self._link()
        until = self.clock.now() + lease

        def running(d: Delivery, tok: Token) -> dict[str, Any]:
            rec = self._running(
                tok.gen,
                env_of(d),
                self.clock.now(),
                until,
                tok.worker,
                tok.reply,
                link,
                tok.claim,
                tok.run_at,
                tok.replays,
            )
            rec[R.HOLDER] = tok.holder
            if tok.raw is not None:
                rec[R.RAW] = tok.raw
            return rec

        written, gone = await self._rewrite(link, held, running)
        for d, _, seq in written:
            d.token.seq = seq
            d.lease_until = until
            with contextlib.suppress(Unavailable):
                link.wire.publish(d.token.reply, b"+WPI")
            link.holder.extended(d.id, until)
        lost += gone
        if gone:
            link.holder.forget({d.id for d in gone})
        link.holder.write()
        await link.wire.flush()
        return lost
