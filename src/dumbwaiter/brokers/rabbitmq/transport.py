"""The worker's fetch on RabbitMQ: consumers, the buffer and the admission.

A fetch that may wait consumes every lane of its queues that is not paused;
RabbitMQ pushes copies into the link's buffer, and a consumer's prefetch
follows the rate the worker drains at (``_prefetch_for``).  A fetch that may
not wait takes what is ready with ``basic.get``, in lane order.

Leases: a fetched job's message stays unacked on this connection until its
outcome is recorded (outcomes.py), so a crashed worker's jobs are
redelivered by RabbitMQ as soon as its connection drops.  The lease itself
(a hung worker, heartbeats, fencing) lives in the record: every copy is
admitted against it first (``_admit``: read, judged and leased in one
``kv_update`` of the state store).  A redelivered copy whose record is
still leased to a live worker is parked in the delay cascade until that
lease ends (RabbitMQ keeps custody of it; the ledger decides when it runs).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import orjson
from pamqp import commands as spec

from ...errors import BrokerError
from ...message import Message
from ...state import State
from .. import transitions as T
from ..base import KvWrite, kv_write
from ..record import Record
from ..types import Binding, DeadLetter, Delivery, delivery_of
from . import topology as topo
from .ledger import (
    BIND,
    DEAD,
    DROP,
    PARK,
    REQUEUE,
    TAKE,
    WAIT,
    RabbitMQLedger,
    Stamp,
    Token,
    Verdict,
    parse_copies,
    still_held,
)
from .link import AMQP_ERRORS, AmqpLink, Raw

#: seconds a copy waiting in the worker for its record (``ledger.LOCAL_GRACE``)
#: waits before its first recheck, doubled each time after: of the order
#: of a record write (docs/benchmarks.md, "Figures behind the core's choices")
FIRST_RECHECK = 0.00025
#: seconds of a worker's drain that its consumers' prefetch may hold beyond
#: its slots (``_prefetch_for``), and the most it holds in all
PREFETCH_HORIZON = 0.05
PREFETCH_MAX = 1000
#: seconds over which that drain rate is measured
PREFETCH_WINDOW = 0.1


class RabbitMQTransport(RabbitMQLedger):
    """The seam's ``fetch`` on RabbitMQ (mixed into ``RabbitMQBroker``)."""

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        link = await self._link()
        try:
            for q in queues:
                await self._declare_queue(link, q)
            if wait <= 0:
                return await self._fetch_now(link, queues, limit, lease, worker)
            return await self._fetch_wait(link, queues, limit, lease, wait, worker)
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "fetch", exc) from exc

    def _from_buffer(self, link: AmqpLink, queues: Sequence[str], limit: int) -> list[Raw]:
        wanted = set(queues)
        picked: list[Raw] = []
        skipped: list[Raw] = []
        buffer = link.buffer
        # from the head, only as far as needed: with a large prefetch the
        # buffer holds many more copies than one fetch takes
        while buffer and len(picked) < limit:
            raw = buffer.popleft()
            (picked if raw.queue in wanted else skipped).append(raw)
        if skipped:
            buffer.extendleft(reversed(skipped))
        order = {lane: i for i, lane in enumerate(topo.LANES)}
        picked.sort(key=lambda r: order[r.lane])  # high lane first (a stable sort)
        return picked

    async def _fetch_now(
        self, link: AmqpLink, queues: Sequence[str], limit: int, lease: float, worker: str
    ) -> list[Delivery]:
        """``wait=0``: what is ready now, exactly, by ``basic.get`` in lane order."""
        out: list[Delivery] = []
        lanes = await self._lanes(queues)
        _recheck_due(link, self.clock.now())
        while len(out) < limit:
            raws = self._from_buffer(link, list(lanes), limit - len(out))
            for q, qlanes in lanes.items():
                for lane in qlanes:
                    while len(raws) < limit - len(out):
                        raw = await link.get(self.names.lane(q, lane), q, lane)
                        if raw is None:
                            break
                        raws.append(raw)
            if not raws:
                # A copy RabbitMQ pushed to this link's consumer (a fetch
                # that waited earlier left it on the queue) is not in the
                # queue for a get: it was in flight.  The channel answers a
                # get after what it delivered before, so such a copy has
                # reached the buffer by the time the get came back empty.
                raws = self._from_buffer(link, list(lanes), limit - len(out))
            if not raws:
                break
            out += await self._admit(link, raws, lease, worker)
        return out

    async def _fetch_wait(
        self,
        link: AmqpLink,
        queues: Sequence[str],
        limit: int,
        lease: float,
        wait: float,
        worker: str,
    ) -> list[Delivery]:
        """``wait>0``: consumers push into this link's buffer; return as soon
        as something is in.  The consumer prefetch is ``prefetch=``, or sized
        by ``_watch`` from the slots the worker asked for first (its
        concurrency) and the rate it drains at."""
        deadline = time.monotonic() + wait
        link.slots = link.slots or max(1, limit)
        while True:
            gen = link.gen
            if not self.prefetch and link.prefetch:
                now = self.clock.now()
                if now - link.settled_since >= PREFETCH_WINDOW:
                    await link.resize(self._prefetch_for(link, now))
            await self._watch(link, queues)
            _recheck_due(link, self.clock.now())
            for _ in range(2):  # let deliveries already read off the socket land
                if not link.buffer or len(link.buffer) >= limit:
                    break
                await asyncio.sleep(0)
            raws = self._from_buffer(link, queues, limit)
            if raws:
                out = await self._admit(link, raws, lease, worker)
                if out:
                    return out
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            link.arrived.clear()
            now = self.clock.now()
            recheck = min(remaining, max(0.01, link.looked_at + 1.0 - now))
            if link.waiting:  # a copy waiting for its record: judge it again on time
                recheck = min(recheck, max(0.0, min(r.recheck_at for r in link.waiting) - now))
            try:
                await asyncio.wait_for(link.arrived.wait(), recheck)
            except TimeoutError:
                pass
            if gen != link.gen or not link.ok():
                raise BrokerError("rabbitmq: the connection was lost during a fetch")

    async def _lanes(self, queues: Sequence[str]) -> dict[str, list[str]]:
        """The lanes of each queue that is not paused, in fetch order (one read)."""
        k = self.keys
        wanted = [k.paused + q for q in queues]
        wanted += [f"{k.lane}{q}\x1f{lane}" for q in queues for lane in (topo.HIGH, topo.LOW)]
        got = await self.state.kv_get(wanted)
        return {
            q: [lane for lane in topo.LANES if lane == topo.MAIN or f"{k.lane}{q}\x1f{lane}" in got]
            for q in queues
            if k.paused + q not in got
        }

    async def _watch(self, link: AmqpLink, queues: Sequence[str]) -> None:
        """Consume every lane of ``queues`` that is not paused; look again
        every second for pauses lifted and priority lanes made since, and
        start consumers with the prefetch of the others (``_prefetch_for``)."""
        now = await self._now()
        if now >= link.looked_at + 1.0 or any(q not in link.looked for q in queues):
            prefetch = link.prefetch or self.prefetch or 2 * link.slots
            lanes = await self._lanes(queues)
            link.looked_at, link.looked = now, set(queues)
            for q in queues:
                if q in lanes:
                    link.paused_until.pop(q, None)
                    for lane in lanes[q]:
                        await link.consume(self.names.lane(q, lane), q, lane, prefetch)
                elif q not in link.paused_until:
                    link.paused_until[q] = now + 1.0
                    for lq in self.names.lanes(q):
                        await link.cancel(lq)

    def _prefetch_for(self, link: AmqpLink, now: float) -> int:
        """The consumers' prefetch: ``prefetch=`` if the URL sets it, else
        the worker's slots plus what it drains in ``PREFETCH_HORIZON``, at
        least twice its slots (the most a worker holds itself: running jobs
        plus its own prefetch of short jobs) and at most ``PREFETCH_MAX``.

        RabbitMQ hands a consumer a new message only once an ack has freed a
        slot, and a quorum queue frees it only after the ack is committed
        to its log: a prefetch that covers only what the worker holds
        leaves a fast worker waiting for every refill (docs/benchmarks.md,
        "Figures behind the core's choices").  Slow jobs keep the prefetch
        at twice the slots, so a worker never holds more than
        ``PREFETCH_HORIZON`` of work that another worker could have
        started.  The rate is measured over ``PREFETCH_WINDOW`` (a large
        backlog drains in seconds: the prefetch must grow within a fraction
        of one), and the size
        changes only when the new one is half or twice the current one (or
        more), so that a steady rate does not re-consume; back to the floor
        (twice the slots) it goes at once, so slow jobs after a burst get
        exactly the prefetch they had before it."""
        if self.prefetch:
            return self.prefetch
        base = 2 * link.slots
        span = now - link.settled_since
        rate = link.settled / span if link.settled_since and span > 0 else 0.0
        link.settled, link.settled_since = 0, now
        want = min(PREFETCH_MAX, max(base, link.slots + math.ceil(rate * PREFETCH_HORIZON)))
        current = link.prefetch or base
        if want != base and current // 2 < want < current * 2:
            return current
        return want

    async def _admit(
        self, link: AmqpLink, raws: list[Raw], lease: float, worker: str
    ) -> list[Delivery]:
        """Judge copies against their records: run, drop (stale), park (its job
        is leased to a live worker, or not due yet) or dead-letter.

        The records are read, judged and the leases written in one
        ``kv_update`` (one transaction and one trip on a SQLite state store:
        two workers handed copies of one job, a copy sent twice, cannot both
        lease it).  Only a fanned-out event without a record takes another
        trip, for its group's binding."""
        k = self.keys
        now = self.clock.now()
        parsed, out = parse_copies(raws, now + lease)
        verdicts = await self._verdicts(link, raws, parsed, now, lease, worker)
        drop: list[int] = []
        requeue: list[int] = []
        parks: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        deads: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        late: dict[str, bytes] = {}
        for (raw, _, did, ev), (verdict, rec) in zip(parsed, verdicts, strict=True):
            if verdict is REQUEUE:
                requeue.append(raw.tag)
                continue
            if verdict is WAIT:  # unacked, in the link, judged again shortly
                _wait_for_record(link, raw, now)
                continue
            if verdict is BIND and ev is not None:
                binding = await self._binding(raw.queue, ev.name)
                msg = delivery_of(ev, binding, did)
                verdict = TAKE
                rec = Record(msg=msg, state=State.READY, run_at=now, updated_at=now)
                T.take_lease(rec, now + lease, worker, now)
                late[k.job + did] = rec.dump()
            if verdict is PARK:
                assert rec is not None
                until = rec.lease_until + topo.UNIT if rec.state is State.RUNNING else rec.run_at
                parks.append(self._copy_delayed_until(raw, until))
            elif verdict is DEAD:
                assert rec is not None
                deads.append(self._dead_copy(rec.msg, raw.queue))
                # stored dead by the verdicts' transaction: report it even if
                # the DLQ copy below fails (its redelivery is then dropped)
                self._found_dead.append(
                    DeadLetter(did, raw.queue, rec.msg.name, rec.msg.errors[-1], rec.msg.copy())
                )
            if verdict is not TAKE or rec is None:
                drop.append(raw.tag)
                continue
            self._leases_held[did] = (rec.token, rec.lease_until)
            self._leases_added += 1
            self._leased_records[did] = rec
            out.append(
                Delivery(
                    id=did,
                    message=rec.msg.copy(),
                    token=Token(rec.token, raw.gen, raw.tag),
                    lease_until=rec.lease_until,
                    queue=raw.queue,
                )
            )
        if late:
            late[k.lease + self.instance] = self._lease_map(now)
            await self.state.kv_set(late)
        if requeue:  # paused since the consumers started: stop them, then give back
            for q in {raw.queue for raw in raws if raw.tag in requeue}:
                link.paused_until[q] = now + 1.0
                for lq in self.names.lanes(q):
                    await link.cancel(lq)
            await link.nack(link.gen, requeue)
        if parks or deads:
            await self._send(parks + deads)
        if drop:
            await link.ack(link.gen, drop)
        return out

    async def _verdicts(
        self,
        link: AmqpLink,
        raws: list[Raw],
        parsed: list[tuple[Raw, Message, str, Message | None]],
        now: float,
        lease: float,
        worker: str,
    ) -> list[Verdict]:
        """``_decide`` in one ``kv_update`` of the copies' records, tombstones
        and pause flags."""
        k = self.keys
        wanted = [k.job + did for _, _, did, _ in parsed]
        wanted += [k.claim + "gone:" + did for _, _, did, _ in parsed]
        wanted += [k.paused + q for q in {raw.queue for raw in raws}]
        pending_acks, link.acks_on_admission = link.acks_on_admission, []
        carried: dict[str, tuple[Stamp, KvWrite]] = {}
        for pending in pending_acks:
            pending.taken = True
            carried.update(pending.planned)
        # the lease map's base, read on this thread; the jobs whose acks
        # carried here are finished by the same write
        held = dict(self._leases_held)
        for pending in pending_acks:
            for id_ in pending.ids:
                held.pop(id_, None)
        keys = list(dict.fromkeys([*wanted, *carried])) if carried else wanted

        def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[Verdict]]:
            if not carried:
                return self._decide(parsed, got, held, now, lease, worker)
            # the acks whose lease still holds are written, and the copies
            # judged as if they had been first (a copy of an acked job is
            # then dropped, not leased over its success)
            acked = still_held(carried, got)
            seen = dict(got)
            for key in wanted:
                if key in acked:
                    seen[key] = kv_write(acked[key])[0]
            writes, verdicts = self._decide(parsed, seen, held, now, lease, worker)
            return {**acked, **writes}, verdicts

        try:
            verdicts = await self.state.kv_update(keys, decide)
        except BaseException as exc:
            for pending in pending_acks:  # not written: their acks raise, and are made again
                if not pending.done.done():
                    pending.done.set_exception(
                        BrokerError(f"rabbitmq ack: the admission carrying it failed: {exc!r}")
                    )
            # the state store failed (or the fetch was cancelled): the copies
            # go back to the head of the buffer, to be judged again by the
            # next fetch; left out, they would stay unacked on a live
            # connection, each holding a slot of the consumer's prefetch
            if raws and raws[0].gen == link.gen:
                link.buffer.extendleft(reversed(raws))
            raise
        for pending in pending_acks:
            if not pending.done.done():
                pending.done.set_result(None)
        return verdicts

    def _decide(
        self,
        parsed: list[tuple[Raw, Message, str, Message | None]],
        got: dict[str, bytes],
        held: dict[str, tuple[int, float]],
        now: float,
        lease: float,
        worker: str,
    ) -> tuple[dict[str, KvWrite], list[Verdict]]:
        """The admission's verdicts and writes (the leased records and this
        broker's lease map, ``held`` plus them), given the records read.

        Two copies of one job in a batch are each judged against the record
        read, except after one of them took the job (leased it, buried it,
        or took an event's delivery without a record): the later one is a
        twin, dropped.  A copy judged stale does not make the next one a
        twin: a killed worker's original, given back by RabbitMQ, and the
        copy its rescue sent can meet in one batch, the original first
        (stale: the rescue bumped the version); had it counted, both would
        be dropped and the ready record left with no copy to serve it.

        Runs in the state store's transaction, maybe twice, maybe on its
        thread: it reads only its arguments, builds new records and changes
        nothing shared."""
        k = self.keys
        writes: dict[str, KvWrite] = {}
        verdicts: list[Verdict] = []
        leased = dict(held)
        #: jobs an earlier copy of this batch took: their record is no longer the one read
        taken: set[str] = set()
        for raw, m, did, ev in parsed:
            if k.paused + raw.queue in got:
                verdicts.append((REQUEUE, None))
                continue
            if did in taken:  # a second copy of a job this very batch took
                verdicts.append((DROP, None))
                continue
            if ev is not None and k.job + did not in got and k.claim + "gone:" + did not in got:
                taken.add(did)
                verdicts.append((BIND, None))  # its record comes with the binding
                continue
            verdict, rec = self._judge(raw, m, did, ev, got, now)
            if verdict is DEAD:
                assert rec is not None
                writes[k.job + did] = rec.dump()
                taken.add(did)
            elif verdict is TAKE and rec is not None:
                if rec.msg is m:  # the parsed copy's: not this call's to change
                    rec.msg = m.copy()
                if not T.take_lease(rec, now + lease, worker, now):
                    verdicts.append((DROP, None))  # judged takeable: never refused
                    continue
                writes[k.job + did] = rec.dump()
                leased[did] = (rec.token, rec.lease_until)
                taken.add(did)
            verdicts.append((verdict, rec))
        if writes:
            writes[k.lease + self.instance] = orjson.dumps({"at": now, "held": leased})
        return writes, verdicts

    async def _binding(self, queue: str, event_type: str) -> Binding:
        for refresh in (False, True):
            bindings = await self._load_bindings() if refresh else self._bindings
            for b in bindings:
                if b.queue == queue and topo.topic_matches(b.pattern, event_type):
                    return b
        return Binding(event_type, queue)


def _wait_for_record(link: AmqpLink, raw: Raw, now: float) -> None:
    """Keep a copy without its record in ``link.waiting`` (unacked) to be
    judged again after ``FIRST_RECHECK``, then after pauses that double."""
    if raw.waited_since == 0.0:
        raw.waited_since, raw.recheck_at = now, now + FIRST_RECHECK
    else:
        raw.recheck_at = now + max(FIRST_RECHECK, now - raw.waited_since)
    link.waiting.append(raw)


def _recheck_due(link: AmqpLink, now: float) -> None:
    """Put the waiting copies whose time to be judged again has come back at
    the head of the buffer (``now`` on the broker's clock)."""
    if not link.waiting:
        return
    due = [r for r in link.waiting if r.recheck_at <= now]
    if due:
        link.waiting = [r for r in link.waiting if r.recheck_at > now]
        link.buffer.extendleft(reversed(due))
