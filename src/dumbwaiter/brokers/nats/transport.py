"""The worker side of the NATS broker: ``fetch`` (pull, then claim each
pointer by writing its job's record: claim.py), ``ack``, ``retry``,
``dead``, ``requeue`` and ``extend`` (a compare-and-set on the record, then
the pointer's ``+ACK``); docs/nats.md, "How a job moves".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from ...state import State
from ..finished import compacts
from ..types import Delivery
from . import records as R
from .claim import Claim
from .connection import LoopLink
from .coordination import Coordination
from .pointers import (
    env_of,
    queue_of,
)
from .protocol import (
    JetStreamError,
    Unavailable,
    pub_ack,
)
from .puller import SETTLE
from .records import Token
from .store import cas_item, is_conflict


class Transport(Claim, Coordination):
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

    async def ack(self, ds: Sequence[Delivery]) -> None:
        now = self.clock.now()

        def final(d: Delivery, tok: Token) -> dict[str, Any]:
            m = d.message
            if compacts(d) and m is not None and m.key is None and tok.raw is None:
                # a compact record (records.py): a job holding a unique key
                # keeps its whole record, as on the other engines
                env = {"id": m.id, "name": m.name, "queue": m.queue, "attempt": m.attempt}
                return R.compact_record(env, tok.gen, now, tok.claim, tok.replays, d.result)
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
            link.holder.finished(d.id, d.token.entry, d.queue or queue_of(d), None)
        if lost:
            link.holder.drop({d.id: d.token.entry for d in lost})
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
                link.holder.finished(d.id, d.token.entry, d.queue or queue_of(d), count)
        finally:
            holder.settling -= ids
        if lost:
            link.holder.drop({d.id: d.token.entry for d in lost})
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
            link.holder.extended(d.id, d.token.entry, until)
        lost += gone
        if gone:
            link.holder.drop({d.id: d.token.entry for d in gone})
        link.holder.write()
        await link.wire.flush()
        return lost
