"""The PostgreSQL broker's worker side: fetch, ack, retry, dead, extend, rescue.

* **Claims** are one ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED
  LIMIT n)``: any number of workers claim disjoint batches without waiting
  for each other.  The same statement first promotes due scheduled jobs
  (eta, retries) to ready.
* **Leases** carry a fencing token; every later change of a running job
  (ack, retry, dead, requeue, extend) presents it, so a worker that lost its
  lease cannot settle a job someone else now holds.
* **Idle fetches** wait on ``LISTEN``; whatever makes a job ready sends
  ``NOTIFY`` in its own transaction.  While LISTEN is down they poll.  An
  idle fetch's claim also registers it as a waiter (``dw_waiters``) that a
  producer can hand a job to (enqueue.py, listen.py).
* **Completions** are one statement per batch (``UPDATE ... FROM unnest``);
  a batch of acks made as the worker's next claim starts travels with it
  (one statement acks and claims: ``_ack_with_claim``).
* **Finished rows** stay in ``dw_jobs`` for the retention window (results,
  ``job.status()``, unique keys) and are then pruned; the states a worker
  polls each have a partial index, so a claim reads live rows only.
* **Maintenance**: every worker calls ``rescue`` each second (an index probe
  when nothing expired); pruning runs on one elected leader (``acquire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from ... import keys
from ...message import ErrorRecord
from ..sql.rows import delivery_row, err_json, stored_message
from ..types import DeadLetter, Delivery, Rescued
from .connection import AckOnClaim, LoopState, PostgresConnection
from .listen import Listener, Waiter
from .queries import LEASE_EXPIRED

log = logging.getLogger("dumbwaiter.postgres")

#: name of the lock whose holder prunes finished jobs (one leader at a time)
MAINTENANCE_LOCK = keys.MAINTENANCE_LOCK
#: rows one prune statement deletes, and at most per round: a leader that
#: falls behind prunes again at its next rescue (each second), not a round later
PRUNE_BATCH = 5000
PRUNE_ROUND = 100_000
#: turns of the event loop an ack waits for a claim to carry it (see ``_ack_with_claim``)
ACK_WAIT_TURNS = 6
#: seconds a waiter's row is kept past its expiry before maintenance deletes it
WAITER_GRACE = 60.0
#: the most seconds a cancelled fetch's withdrawal waits for a handoff that
#: was in flight to it (the next fetch of the loop waits for the withdrawal)
WITHDRAW_HOLD = 1.0


class PostgresTransport(PostgresConnection):
    """The worker's calls: fetch and the outcomes of its jobs."""

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0 or not queues:
            return []
        queues = list(queues)
        st = self._state()
        listener = st.listener
        # jobs handed to this loop after their fetch had stopped waiting
        kept = listener.take(queues, limit)
        if kept:
            return kept
        await _withdrawn(st)
        if wait <= 0:
            return (await self._claim_safely(st, queues, limit, lease, worker))[0]
        deadline = time.monotonic() + wait
        if not listener.listening:  # the first wait of this loop: LISTEN first
            await listener.ready(min(wait, 1.0))
        # The waiter exists before the claim, so a NOTIFY sent after the claim's
        # snapshot is never missed; an idle pass is one round trip.  The claim
        # registers this fetch for a handoff until its deadline if it found
        # nothing; a job handed to it comes with the NOTIFY, ready to run.
        waiter = listener.add(queues)
        # A busy worker (its last claim found jobs) claims plainly first: the
        # idle claim's extra steps (settle waits, register) are a cost a busy
        # worker's claim seldom needs (docs/benchmarks-postgres.md); when it
        # comes back empty, the idle claim follows at once.
        plain = st.busy
        try:
            while True:
                waiter.event.clear()
                remaining = deadline - time.monotonic()
                if plain:
                    out, due = await self._claim_safely(st, queues, limit, lease, worker)
                else:
                    out, due = await self._claim_safely(
                        st, queues, limit, lease, worker, waiter, remaining
                    )
                st.busy = bool(out)
                if waiter.handed:  # handed while the claim was on its way
                    out = self._merge(listener, waiter, out, limit)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                if plain:  # idle now: claim again, registering the wait
                    plain = False
                    continue
                if due is not None:
                    remaining = min(remaining, max(0.0, due))
                if not listener.listening:
                    remaining = min(remaining, self.opts.poll_interval)
                await waiter.wait(remaining)
                out = self._merge(listener, waiter, listener.take(queues, limit), limit)
                if out:
                    return out
        except asyncio.CancelledError:
            # stopped (the worker stops): withdraw this fetch's waits now,
            # and give back what was handed to them meanwhile
            listener.remove(waiter)
            task = st.loop.create_task(self._withdraw(st, queues, lease, worker, waiter))
            st.giving_back.add(task)
            task.add_done_callback(st.giving_back.discard)
            raise
        finally:
            listener.remove(waiter)

    @staticmethod
    def _merge(
        listener: Listener, waiter: Waiter, out: list[Delivery], limit: int
    ) -> list[Delivery]:
        """What the fetch of ``waiter`` returns: the jobs handed to it, then
        ``out``; any beyond ``limit`` wait in the inbox for the next fetch."""
        if waiter.handed:
            got, waiter.handed = waiter.handed, []
            seen = {d.id for d in got}
            out = got + [d for d in out if d.id not in seen]
        if len(out) > limit:
            listener.keep(out[limit:])
            out = out[:limit]
        return out

    async def _withdraw(
        self, st: LoopState, queues: list[str], lease: float, worker: str, waiter: Waiter
    ) -> None:
        """Settle the waits of a fetch that was cancelled, and give back
        (uncharged) the jobs handed to them."""
        listener = st.listener
        if self._loops.current() is not st:  # closed meanwhile: _settle did it
            return
        try:
            out: list[Delivery] = []
            deadline = time.monotonic() + WITHDRAW_HOLD
            while True:
                waiter.event.clear()
                got, _ = await self._run(
                    lambda c: self._claim(c, queues, 0, lease, worker, None, listener, waiter),
                    retry=False,
                    work=True,
                )
                out += got
                # A wait a producer was handing a job to right then (busy: its
                # row locked) is settled by that job's NOTIFY, or adopted by the
                # next claim once the handoff committed: settle it here, so
                # that when the withdrawal ends (the next fetch waits for it)
                # such a job is ready again, not on its way to the inbox.
                remaining = deadline - time.monotonic()
                if not listener.carries(waiter) or remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), min(remaining, 0.05))
                if not listener.carries(waiter):
                    break
            out += listener.take(queues, len(listener.inbox))
            await self.requeue(out)
        except Exception as exc:  # their leases run out; the rescuer gives them back
            log.debug("could not withdraw an idle fetch's waits: %s", exc)

    async def _settle(self) -> None:
        """Before this loop's connections close: the waits this loop left are
        withdrawn and the jobs handed to them given back, uncharged."""
        st = self._loops.current()
        if st is None:
            return
        await asyncio.gather(*st.giving_back, return_exceptions=True)
        listener = st.listener
        back = listener.drain()
        try:
            if listener.pending:
                queues = sorted({q for w in listener.pending.values() for q in w.queues})
                gone = Waiter(queues)
                gone.active = False  # carries every pending wait: all are of these queues
                out, _ = await self._run(
                    lambda c: self._claim(c, queues, 0, 1.0, "", None, listener, gone),
                    retry=False,
                    work=True,
                )
                back += out
            await self.requeue(back)
        except Exception as exc:
            log.debug("could not withdraw this loop's waits on close: %s", exc)

    async def _claim_safely(
        self,
        st: LoopState,
        queues: list[str],
        limit: int,
        lease: float,
        worker: str,
        waiter: Waiter | None = None,
        wait: float = 0.0,
    ) -> tuple[list[Delivery], float | None]:
        """A claim that can be cancelled: if the caller gives up while the
        claim is in flight, what it claimed is given back (uncharged).

        Until its first statement is sent, the claim is *boarding*: acks made
        meanwhile on this loop wait to travel with it (see ``ack``)."""
        ticket = _Ticket(st)
        listener = st.listener if waiter is not None else None
        task = asyncio.ensure_future(
            self._run(
                lambda c: self._claim(
                    c, queues, limit, lease, worker, ticket, listener, waiter, wait
                ),
                retry=False,
                work=True,
            )
        )
        task.add_done_callback(lambda _: ticket.leave())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def give_back(t: asyncio.Future[tuple[list[Delivery], float | None]]) -> None:
                if t.cancelled() or t.exception() is not None or not t.result()[0]:
                    return
                self._give_back(st, t.result()[0])

            task.add_done_callback(give_back)
            raise

    async def _claim(
        self,
        conn: psycopg.AsyncConnection[Any],
        queues: list[str],
        limit: int,
        lease: float,
        worker: str,
        ticket: _Ticket | None = None,
        listener: Listener | None = None,
        waiter: Waiter | None = None,
        wait: float = 0.0,
    ) -> tuple[list[Delivery], float | None]:
        """Claim up to ``limit`` jobs; with none, also say in how many seconds
        the next scheduled job of ``queues`` is due (None: none is).  The
        first statement also acks the acks waiting on this loop, if any.

        With a ``waiter`` (an idle fetch's claim) it also settles the waits
        of this loop that ``waiter`` carries (adopting a job handed to one
        whose NOTIFY was lost) and, with nothing to return and ``wait`` > 0,
        registers a new wait of ``wait`` seconds (queries.waiting)."""
        token = secrets.randbits(62)
        params: dict[str, Any] = {"token": token, "lease": lease, "worker": worker, "limit": limit}
        claim, fused = self._claims(params, queues, listener is not None and waiter is not None)
        pending_acks = ticket.take() if ticket is not None else []
        stmt = claim
        if pending_acks:
            params.update(_acks([d for r in pending_acks for d in r.ds], "ack_"))
            params["retention"] = self.retention
            stmt = fused
        rows: list[tuple[Any, int]] = []  # (row, its token)
        due = None
        while True:
            carried: list[int] = []
            if listener is not None and waiter is not None:
                # a wait is registered only with nothing claimed yet (the
                # adoption of a handed job goes by its token)
                carried = _idle_claim_params(params, listener, waiter, token, 0.0 if rows else wait)
            try:
                cur = await conn.execute(stmt, params, binary=True)
                got = await cur.fetchall()
            except BaseException as exc:
                for r in pending_acks:  # not acked: their callers retry them
                    if not r.done.done():
                        r.done.set_exception(_unsettled(exc))
                raise
            finally:
                if listener is not None:
                    listener.registering.discard(token)
            for r in pending_acks:
                if not r.done.done():
                    r.done.set_result(True)
            pending_acks, stmt = [], claim
            if listener is not None:
                promoted, due = _read_idle_claim(listener, got, token, carried, rows)
            else:
                promoted = got[0][8] if got else 0
                if got and got[0][0] is None:
                    due = got[0][9]
                else:
                    rows += [(r, token) for r in got]
            # due jobs were just promoted: the next statement can claim them
            if not promoted or len(rows) >= limit:
                break
            params["limit"] = limit - len(rows)
        if len(rows) > 1:  # RETURNING has no order: priority, then FIFO, per queue
            order = {q: i for i, q in enumerate(queues)}
            rows.sort(key=lambda x: (order.get(x[0][1], 0), -x[0][5], x[0][6], x[0][0]))
        return [delivery_row(r, t) for r, t in rows], (None if rows else due)

    def _claims(
        self, params: dict[str, Any], queues: list[str], waiting: bool
    ) -> tuple[bytes, bytes]:
        """The claim statement for ``queues`` and its variant that carries
        acks; ``waiting``: an idle fetch's (queries.waiting)."""
        q = self.q
        if len(queues) == 1:
            params["queue"] = queues[0]
            return (q.wait_one, q.ack_wait_one) if waiting else (q.claim_one, q.ack_claim_one)
        params["queues"] = queues
        return (q.wait_many, q.ack_wait_many) if waiting else (q.claim_many, q.ack_claim_many)

    def _batch(self, ds: Sequence[Delivery]) -> dict[str, Any]:
        return {
            "id": ",".join([d.id for d in ds]),
            "token": ",".join([str(d.token) for d in ds]),
            "retention": self.retention,
            "channel": self.q.channel,
        }

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        # Every ack may ride, results or not: the worker sends each success's
        # record (its times), so an ack that could not carry one would never
        # ride (docs/benchmarks.md, "Issue 19.5").
        if await self._ack_with_claim(ds):
            return
        params = _acks(ds)
        params["retention"] = self.retention
        await self._run(lambda c: c.execute(self.q.ack, params), work=True)

    async def _ack_with_claim(self, ds: Sequence[Delivery]) -> bool:
        """Ack ``ds`` with a claim of this loop, if one is about to be sent:
        True once acked that way, False if none came (the caller acks alone).

        A worker's finished job wakes its settler (the ack) and its fetch loop
        (the next claim) together; the claim boards a few turns of the loop
        later (the fetch's task, then the claim's).  So the ack waits at most
        ``ACK_WAIT_TURNS`` turns for a claim to board, then travels alone (how many
        go with a claim: docs/benchmarks-postgres.md).  Either way it is one transaction:
        the job is acked, or not at all and retried."""
        st = self._state()
        pending = AckOnClaim(ds, st.loop.create_future())
        st.acks_on_claim.append(pending)
        try:
            for _ in range(ACK_WAIT_TURNS):
                if st.boarding or pending.done.done():
                    break
                await asyncio.sleep(0)
            if not st.boarding and not pending.done.done():
                st.acks_on_claim.remove(pending)
                return False
            return await pending.done
        finally:
            if pending in st.acks_on_claim:  # cancelled while waiting
                st.acks_on_claim.remove(pending)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        await self._read_clock()
        params = self._batch(ds)
        params["at"] = [self.clock.to_server(d.retry_at) for d in ds]
        params["err"] = [err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.retry, params), work=True)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        params["err"] = [err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.dead, params), work=True)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._read_clock()
            params = self._batch(ds)
            params["at"] = [self.clock.to_server(d.retry_at) for d in ds]
            await self._run(lambda c: c.execute(self.q.requeue, params), work=True)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        params = self._batch(ds)
        params["lease"] = lease

        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, float]:
            cur = await c.execute(self.q.extend, params)
            return {i: float(u) for i, u in await cur.fetchall()}

        kept = await self._run(run, work=True)
        lost = []
        for d in ds:
            until = kept.get(d.id)
            if until is None:
                lost.append(d)
            else:
                d.lease_until = until
        return lost

    async def rescue(self) -> Rescued:
        async def run(c: psycopg.AsyncConnection[Any]) -> Rescued:
            cur = await c.execute(self.q.rescue, {"type": LEASE_EXPIRED, "channel": self.q.channel})
            row = await cur.fetchone()
            if not row:
                return Rescued()
            dead = [
                DeadLetter(
                    str(id_),
                    str(queue),
                    str(name),
                    ErrorRecord.from_dict(err or {}),
                    stored_message(bytes.fromhex(body), str(queue), int(attempt), errors),
                )
                for id_, queue, name, err, attempt, body, errors in row[2] or ()
            ]
            return Rescued(int(row[0]), dead)

        n = await self._run(run, work=True)
        now = time.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + self.opts.prune_interval
            if await self.maintain() and self._prune_behind:
                # more expired rows than one round deletes: again next rescue
                self._next_prune = now
        return n

    async def maintain(self) -> bool:
        """Prune finished jobs past their retention and expired kv entries, if
        this broker is (or becomes) the maintenance leader.  True if it was."""
        ttl = 3 * self.opts.prune_interval
        if await self.acquire(MAINTENANCE_LOCK, self._owner, ttl) is None:
            return False

        async def prune(c: psycopg.AsyncConnection[Any]) -> bool:
            behind = True
            for _ in range(PRUNE_ROUND // PRUNE_BATCH):  # short statements, short locks
                cur = await c.execute(self.q.prune_jobs, (PRUNE_BATCH,))
                if cur.rowcount < PRUNE_BATCH:
                    behind = False
                    break
            await c.execute(self.q.prune_kv)
            await c.execute(self.q.fold_counts)
            await c.execute(self.q.prune_counts)
            await c.execute(self.q.prune_rate)
            await c.execute(self.q.prune_slots)
            await c.execute(self.q.prune_waiters, (WAITER_GRACE,))
            cur = await c.execute(self.q.prune_events, (self.event_retention, PRUNE_BATCH))
            return behind or cur.rowcount == PRUNE_BATCH

        self._prune_behind = await self._run(prune, work=True)
        return True


class _Ticket:
    """One claim's place among the claims boarding on a loop (``st.boarding``)."""

    __slots__ = ("aboard", "st")

    def __init__(self, st: LoopState) -> None:
        self.st = st
        self.aboard = True
        st.boarding += 1

    def take(self) -> list[AckOnClaim]:
        """The acks waiting now; the claim has left the boarding."""
        pending_acks, self.st.acks_on_claim = self.st.acks_on_claim, []
        self.leave()
        return pending_acks

    def leave(self) -> None:
        """Done boarding (sent, failed or cancelled).  The last claim to leave
        sends the acks it did not take off alone."""
        if not self.aboard:
            return
        self.aboard = False
        st = self.st
        st.boarding -= 1
        if not st.boarding:
            pending_acks, st.acks_on_claim = st.acks_on_claim, []
            for r in pending_acks:
                if not r.done.done():
                    r.done.set_result(False)


async def _withdrawn(st: LoopState) -> None:
    """Wait for the withdrawals of this loop's cancelled fetches: a job being
    handed to one of their waits is running for nobody until it reaches the
    inbox or the withdrawal gives it back, so a claim before that would not
    see it (a fetch right after a cancelled one would miss a job just
    enqueued)."""
    if st.giving_back:
        await asyncio.gather(*list(st.giving_back), return_exceptions=True)


def _idle_claim_params(
    params: dict[str, Any], listener: Listener, waiter: Waiter, token: int, wait: float
) -> list[int]:
    """The parameters of an idle fetch's claim: the waits it settles (returned)
    and its own, registered for ``wait`` seconds while handoffs can reach us."""
    carried = listener.carried(waiter)
    params["mine"] = ",".join(map(str, carried))
    params["channel"] = listener.hand_channel
    params["wait"] = wait if listener.listening else 0.0
    if params["wait"] > 0:
        listener.pending[token] = waiter
        listener.registering.add(token)
    return carried


def _read_idle_claim(
    listener: Listener,
    got: list[Any],
    token: int,
    carried: list[int],
    rows: list[tuple[Any, int]],
) -> tuple[int, float | None]:
    """Read an idle fetch's claim (queries.waiting): its claimed and adopted
    jobs go to ``rows``; the waits it settled leave ``listener.pending``, as
    does its own if it did not register.  Returns (promoted, due)."""
    promoted, due, registered, busy = 0, None, 0, None
    for r in got:
        if r[0] is None:  # the one row of the statement's findings
            promoted, due, registered, busy = r[9], r[10], r[11], r[12]
        elif r[8] is None:
            rows.append((r, token))
        elif listener.pending.pop(r[8], None) is not None:
            rows.append((r, r[8]))  # adopted: handed to us, its NOTIFY lost
        # else: its NOTIFY came first, and the job went to a fetch that way
    in_flight = {int(t) for t in busy.split(",")} if busy else set()
    for t in carried:  # settled: handed nothing, or adopted
        if t not in in_flight:
            listener.pending.pop(t, None)
    if not registered:
        listener.pending.pop(token, None)
    return promoted, due


def _acks(ds: Sequence[Delivery], prefix: str = "") -> dict[str, Any]:
    """The parameters of an ack of ``ds`` (queries.py's ``ack``): ids, tokens
    and kept-for seconds as comma-joined strings (a text parameter costs far
    less to send than a list dumped as an array), the records as one binary
    array."""
    return {
        prefix + "id": ",".join([d.id for d in ds]),
        prefix + "token": ",".join([str(d.token) for d in ds]),
        prefix + "result": [d.result for d in ds],
        prefix + "keep": ",".join(
            ["" if d.result is None or d.result_ttl is None else repr(d.result_ttl) for d in ds]
        ),
    }


def _unsettled(exc: BaseException) -> BaseException:
    """What an ack that waited for a claim raises when the claim failed."""
    if isinstance(exc, Exception):
        return exc
    return psycopg.OperationalError(f"the claim carrying this ack did not complete: {exc!r}")
