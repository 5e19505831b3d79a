"""``nats://HOST:PORT?prefix=NAME``: the JetStream broker.

How the seam maps onto JetStream (docs/nats.md has the full story):

* **enqueue** publishes one message per job: a *pointer* to the work
  stream (``dw.NS.w.QUEUE.PRIO``, de-duplicated by ``Nats-Msg-Id`` = job
  id), which is also how ``get`` finds a job nobody has touched yet (by that
  id; index entries ``dw.NS.j.e.ID`` are written later for jobs that wait:
  ``Core._index_fresh``).  A job with an ``eta`` goes to the delay subjects
  ``dw.NS.d.QUEUE.s`` instead, with its index entry.  An id enqueued again after
  the de-duplication window gets a second pointer, which its claim drops:
  the job still runs once.
* **fetch** pulls from one durable pull consumer per queue and priority
  level (higher levels first) and *claims* each delivery by creating the
  job's state record (``dw.NS.j.s.ID``) with a compare-and-set; the record's
  sequence is the delivery's fencing token (records.py).  An idle fetch
  parks a pull request with ``expires`` on every level it may take from.
* **ack / retry / dead / requeue** rewrite the record with a compare-and-set
  on the token (a late worker's settle is refused), then ``+ACK`` the
  pointer.  A retry, a requeue or a rescue publishes a new pointer (a delay
  entry while it waits) with a fresh generation; dead letters go to the DLQ
  stream with every error.
* **lease**: the record's ``lease_until``; **extend** rewrites it and sends
  ``+WPI`` so JetStream does not redeliver (AckWait is only the backstop).
  Each process lists its running jobs in its holder message (HOLD stream);
  **rescue** reads those and gives expired jobs back with a ``LeaseExpired``
  error.  A pointer that JetStream redelivers after AckWait is rescued by
  the fetch that gets it.
* **delays**: delay entries are held by JetStream itself with
  ``-NAK {"delay": ...}`` on the ``delay`` consumer and moved to the work
  subjects when due (the promoter, one per fetching process).

The broker serves several event loops (an App's sync calls run on its
portal loop, a worker on its own): each loop gets its own connection
(``Link``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import orjson

from ...errors import BrokerError, BrokerUnavailable, MessageDecodeError
from ...message import ErrorRecord, Message, encode_checked, from_dict
from ...state import State
from ..base import (
    FOUND_DEAD_LIMIT,
    Binding,
    Capabilities,
    DeadLetter,
    Delivery,
    Rescued,
    delivery_of,
)
from ..deadline import Backoff
from . import records as R
from .admin import Admin
from .coord import Coordination
from .core import (
    MAX_HOLD,
    SWEEP_EVERY,
    UNIQUE_BLOCKS,
    Ptr,
    delivery_id,
    env_of,
    lease_error,
    queue_of,
)
from .link import Link
from .names import untok
from .puller import SETTLE, Pulled
from .records import Token
from .store import Stored, ack_meta, cas_item, is_conflict
from .wire import (
    Batch,
    JetStreamError,
    Reply,
    Unavailable,
    header,
    headers,
    pub_ack,
)

log = logging.getLogger("dumbwaiter.nats")
_NS_PER_S = 1_000_000_000
#: the lock one process holds while it rescues expired leases for everyone
_LOCK_RESCUE = "dw:rescue"
#: publishes handed to the socket at a time by a bulk enqueue
SEND_CHUNK = 512
#: seconds of index catch-up per rescue (it shares the worker's loop; a
#: ``get`` that needs an entry not written yet writes it itself)
INDEX_BUDGET = 0.2


class NatsBroker(Admin, Coordination):
    capabilities: ClassVar[Capabilities] = Capabilities(
        native_delay=True,
        priorities=True,
        blocking_fetch=True,
        # nats-py is asyncio-only: a sync producer goes through the App's
        # portal (one thread hop per call); see docs/nats.md
        sync_enqueue=False,
        multi_process=True,
        multi_host=True,
        results=True,
        # the server's default max_payload is 1 MiB; a state record carries the
        # envelope plus its errors, so envelopes get the rest
        max_message_size=1024 * 1024 - 128 * 1024,
        events=True,
        ordered_keys=False,
        limits=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("nats",)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        #: jobs this process dead-lettered for a lost lease (at a claim or a
        #: rescue), for the next ``rescue`` to report
        self._found_dead: deque[DeadLetter] = deque(maxlen=FOUND_DEAD_LIMIT)

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        link = await self._link()
        if queues:
            await self._merge_config(link, b"queues", lambda q: sorted(set(q or []) | set(queues)))
            link.queues |= set(queues)
        if bindings:

            def merge(cur: Any) -> Any:
                table: dict[str, dict[str, int]] = {k: dict(v) for k, v in (cur or {}).items()}
                for b in bindings:
                    table.setdefault(b.pattern, {})[b.queue] = b.max_attempts
                return table

            await self._merge_config(link, b"bind", merge)
        n = self.n
        for q in queues:  # the consumers only: a producer that declares never pulls
            await link.consumer(n.consumer(q, 0), n.pointer(q, 0), self.settings.ack_wait)

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        prepared = self._encode(msgs)
        if len(prepared) == 1:
            # A request handler's single enqueue on this loop's connected
            # link: straight to ``_store_one``, without the three coroutines
            # of ``_store_jobs`` -> ``_link`` -> ``_store_once`` (about a
            # tenth of the CPU per job with 1,000 concurrent callers).  The
            # same conditions as ``_store_once``'s; when NATS is unreachable
            # the general path below retries (the publish is idempotent: its
            # Nats-Msg-Id is the job's id).
            m, body = prepared[0]
            link = self._last
            if (
                link is not None
                and link.ready
                and m.queue in link.queues
                and (m.key is None or m.kind != "task")
                and link.loop is asyncio.get_running_loop()
            ):
                now = self.clock.now()
                if m.eta is None or self.clock.to_server(m.eta) <= now:
                    try:
                        return [(await self._store_one(link, m, body, now))[0]]
                    except Unavailable:
                        pass
        elif not prepared:
            return []
        return [i for i, _ in await self._store_jobs(prepared)]

    def _encode(self, msgs: Iterable[Message]) -> list[tuple[Message, bytes]]:
        """Encode (and size-check) every message before anything is sent."""
        limit = self.max_message_size
        return [(m, encode_checked(m, limit)) for m in msgs]

    async def _store_jobs(self, prepared: list[tuple[Message, bytes]]) -> list[tuple[str, bool]]:
        """Store jobs; (id, newly stored) per message.  Retried with backoff
        while NATS is unreachable (every write here is idempotent), until the
        producer's deadline (or for ``reconnect`` seconds)."""
        backoff: Backoff | None = None
        while True:
            try:
                link = await self._link()
                return await self._store_once(link, prepared)
            except BrokerUnavailable as exc:  # the wire's, or the connect's (_link)
                backoff = backoff or Backoff(self.settings.reconnect)
                pause = backoff.pause()
                if pause is None:
                    raise self.failure(exc, backoff.waited) from (exc.__cause__ or exc)
                log.warning("nats enqueue failed (%s); trying again in %.2f s", exc, pause)
                await asyncio.sleep(pause)

    async def _store_once(
        self, link: Link, prepared: list[tuple[Message, bytes]]
    ) -> list[tuple[str, bool]]:
        """Publish every job's pointer (a delay entry and an index entry for
        an ``eta``), all pipelined, then wait for every PubAck.  A job is new
        unless JetStream calls its pointer a duplicate (``Nats-Msg-Id`` = id,
        inside the de-duplication window)."""
        now = self.clock.now()
        if len(prepared) == 1:
            m, body = prepared[0]
            if (
                m.queue in link.queues
                and (m.key is None or m.kind != "task")
                and (m.eta is None or self.clock.to_server(m.eta) <= now)
            ):
                return [await self._store_one(link, m, body, now)]
        result: list[tuple[str, bool] | None] = [None] * len(prepared)
        send = range(len(prepared))
        new_queues = {m.queue for m, _ in prepared} - link.queues
        if new_queues:  # queues stay listed (stats) once they were used
            await self._merge_config(link, b"queues", lambda q: sorted(set(q or []) | new_queues))
            link.queues |= new_queues
        if any(m.key is not None and m.kind == "task" for m, _ in prepared):
            send = await self._take_keys(link, prepared, result)  # type: ignore[assignment]
        n = self.n
        je = n.je
        index_hdr = b"NATS/1.0\r\nDw-U: %s\r\nDw-Ra: " % repr(now).encode()
        subjects = link.subjects
        items: list[tuple[bytes, bytes, bytes | None]] = []
        indexed: set[int] = set()
        for i in send:
            m, body = prepared[i]
            mid = m.id.encode()
            eta = None if m.eta is None else self.clock.to_server(m.eta)
            if eta is not None and eta > now:
                ra = repr(eta).encode()
                subject = n.delayed(m.queue, b"s")
                hdr = headers(
                    (b"Nats-Msg-Id", mid), (b"Dw-Id", mid), (b"Dw-G", b"0"),
                    (b"Dw-P", m.priority), (b"Dw-At", ra),
                )  # fmt: skip
            else:
                ra = b"0"
                key = (m.queue, m.priority)
                cached = subjects.get(key)
                if cached is None:
                    cached = subjects[key] = n.pointer(m.queue, m.priority)
                    if m.priority:
                        link.level_seen(m.queue, m.priority)
                subject = cached
                hdr = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nDw-Id: %s\r\nDw-G: 0\r\n\r\n" % (mid, mid)
            items.append((subject, body, hdr))
            if ra != b"0":
                # a delay entry is not found by get the way a pointer is
                # (Core._lookup), so a delayed job keeps its index entry
                items.append((je + mid, body, index_hdr + ra + b"\r\n\r\n"))
                indexed.add(i)
        batches = []
        for k in range(0, len(items), SEND_CHUNK):
            # write each chunk as soon as it is built (and yield once, so the
            # replies are read): the server stores one while the next is built
            batches.append(link.wire.batch(items[k : k + SEND_CHUNK]))
            await link.wire.flush()
            if len(items) > SEND_CHUNK:
                await asyncio.sleep(0)
        replies = iter([r for b in batches for r in await b.wait()])
        for i in send:
            ptr = pub_ack(next(replies), "pointer")
            if i in indexed:
                pub_ack(next(replies), "index")
            result[i] = (prepared[i][0].id, not ptr.duplicate)
        return [r if r is not None else ("", False) for r in result]

    async def _store_one(self, link: Link, m: Message, body: bytes, now: float) -> tuple[str, bool]:
        """``_store_once`` for the usual single enqueue (a request handler's
        ``aenqueue``: a known queue, no key, due now): the same publish and
        the same headers, without what a batch of many needs (queue and
        key checks, delay entries, chunks, reply lists).  With a thousand
        handlers enqueuing at once, that bookkeeping was about a sixth of the
        producer's CPU per job (``benchmarks/nats_enqueue.py``)."""
        mid = m.id.encode()
        subject = link.subjects.get((m.queue, m.priority))
        if subject is None:
            subject = link.subjects[(m.queue, m.priority)] = self.n.pointer(m.queue, m.priority)
            if m.priority:
                link.level_seen(m.queue, m.priority)
        wire = link.wire
        hdr = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nDw-Id: %s\r\nDw-G: 0\r\n\r\n" % (mid, mid)
        fut = wire.request(subject, body, hdr)
        await wire.flush()
        return m.id, not pub_ack(await fut, "pointer").duplicate

    async def _take_keys(
        self,
        link: Link,
        prepared: list[tuple[Message, bytes]],
        result: list[tuple[str, bool] | None],
    ) -> list[int]:
        """Resolve task keys before storing: a key held by a stored job (in a
        state its unique mode blocks) makes the message that job.  Returns the
        indexes still to store."""
        send: list[int] = []
        first: dict[str, int] = {}
        for i, (m, _) in enumerate(prepared):
            if m.key is None or m.kind != "task":
                send.append(i)
                continue
            if m.key in first:  # the same key earlier in this batch wins
                result[i] = (prepared[first[m.key]][0].id, False)
                continue
            first[m.key] = i
            holder = await self._claim_key(link, m)
            if holder is None:
                send.append(i)
            else:
                result[i] = (holder, False)
        for key, i in first.items():
            if result[i] is None:
                continue
            for j, (m, _) in enumerate(prepared):  # batch duplicates follow their winner
                if j != i and m.key == key and m.kind == "task":
                    result[j] = result[i]
        return send

    async def _claim_key(self, link: Link, m: Message) -> str | None:
        """Take ``m.key`` for ``m`` (None) or return the id of the job holding it."""
        assert m.key is not None
        subject = self.n.unique(m.key)
        value = orjson.dumps({"id": m.id, "key": m.key})
        blocks = UNIQUE_BLOCKS.get(str(m.headers.get("unique", "")))
        for _ in range(50):
            cur = await link.store.read(self.n.jobs, subject)
            if cur is not None:
                held = orjson.loads(cur.data)
                holder = str(held.get("id"))
                if holder == m.id:
                    return None
                info = await self._get(link, holder)
                if info is not None and (blocks is None or info.state.value in blocks):
                    return holder
            try:
                await link.store.put(subject, value, cur.seq if cur else 0)
                return None
            except JetStreamError as exc:
                if not is_conflict(exc):
                    raise
        raise BrokerError(f"nats: the key {m.key!r} kept changing hands; gave up")

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
        self, link: Link, items: list[Pulled], lease: float, worker: str
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

    def _unlist(self, link: Link, added: dict[str, list[Any]], ids: set[str]) -> None:
        """Take out of the holder list the jobs this claim listed and did not
        deliver (``ids``), and write it."""
        gone = {jid: added[jid] for jid in ids if jid in added}
        if gone:
            link.holder.drop(gone)
            link.holder.write()
            with contextlib.suppress(Exception):
                link.wire.write_now()

    def _claim_send(
        self, link: Link, items: list[Pulled], lease: float, worker: str
    ) -> tuple[list[tuple[Ptr, dict[str, Any], Message]], list[Ptr], Batch, float, float]:
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
        link: Link,
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

    def _give_back(self, link: Link, ps: list[Ptr]) -> None:
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
        link: Link,
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

    async def _claim_slow(self, link: Link, p: Ptr, until: float, worker: str) -> Delivery | None:
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
        self, link: Link, p: Ptr, cur: Stored | None, now: float
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
                    self._found_dead.append(_dead_letter(env))
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
    def _kept_raw(link: Link, raw: bytes, error: str | None) -> tuple[str, str]:
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

    def _drop(self, link: Link, p: Ptr) -> None:
        with contextlib.suppress(Unavailable):
            link.wire.publish(p.reply, b"+ACK")

    def _hold(self, link: Link, p: Ptr, seconds: float) -> None:
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
        self, link: Link, ds: list[Delivery], build: Any
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

    async def rescue(self) -> Rescued:
        link = await self._link()
        n = 0
        if await self.acquire(_LOCK_RESCUE, link.holder.id, 5.0) is not None:
            for h in await self._holders(link):
                n += await self._rescue_holder(link, h)
            try:  # before their Nats-Msg-Id leaves the window (Core._lookup)
                await self._index_fresh(
                    link, self.clock.now() - self.settings.dupe_window / 2, INDEX_BUDGET
                )
            except Unavailable:
                raise
            except Exception:
                log.exception("nats: indexing waiting jobs failed")
            now = time.monotonic()
            if now - link.swept >= SWEEP_EVERY:
                link.swept = now
                try:
                    await self._sweep_kv(link)
                except Unavailable:
                    raise
                except Exception:
                    log.exception("nats: kv expiry sweep failed")
        await self._reconcile_own(link)
        # taken last, with no await in between: what a claim or this call
        # buried is reported once, and kept for the next call if this one failed
        dead = list(self._found_dead)
        self._found_dead.clear()
        return Rescued(n + len(dead), dead)

    async def _rescue_holder(self, link: Link, h: tuple[str, Stored, dict[str, Any]]) -> int:
        """Give back the expired jobs one process listed; tidy its list.

        This process' own list is only read for jobs to give back: what it
        lists otherwise is decided from its memory, which is newer than the
        stored list (``_reconcile_own``, called by every ``rescue``)."""
        holder, cur, content = h
        now = self.clock.now()
        run: dict[str, list[Any]] = content.get("run", {})
        expired = [(jid, e) for jid, e in run.items() if float(e[1]) < now]
        if not expired:
            return 0
        recs = await link.store.read_many(
            self.n.jobs, [self.n.js + jid.encode() for jid, _ in expired]
        )
        n = 0
        remove: set[str] = set()
        credit: dict[str, list[int]] = {}
        own = holder == link.holder.id
        for (jid, entry), rc in zip(expired, recs, strict=True):
            if rc is None:
                remove.add(jid)
                continue
            rec = R.loads(rc.data)
            st = rec.get(R.ST)
            if st == R.RUNNING:
                if float(rec.get(R.LEASE, 0)) >= now:
                    continue  # extended since the list was written
                if await self._rescue_one(link, rec, rc.seq, now):
                    n += 1
                remove.add(jid)
                continue
            if own:
                continue
            if rec.get(R.SETTLED_BY) == holder:
                # Settled by that process, and still in its list: the list
                # was last written before the settle counted the job (a
                # settle takes the job out of ``run`` and counts it in one
                # step), and the process died before writing it again.
                # (Not a time comparison: a list written by another task of
                # that process while the settle was on its way is newer than
                # the record and still lacks the count.)
                if st == State.SUCCEEDED.value:
                    c = credit.setdefault(str(entry[0]), [0, 0])
                    c[0] += 1
                elif st == State.DEAD.value:
                    await self._dlq_publish(link, rec)
                if rec.get(R.ACK):  # the pointer may not have been acked either
                    with contextlib.suppress(Unavailable):
                        link.wire.publish(str(rec[R.ACK]).encode(), b"+ACK")
            remove.add(jid)
        if remove and not own:
            await self._tidy_holder(link, holder, cur, content, remove, credit, now)
        return n

    async def _tidy_holder(
        self,
        link: Link,
        holder: str,
        cur: Stored,
        content: dict[str, Any],
        remove: set[str],
        credit: dict[str, list[int]],
        now: float,
    ) -> None:
        run = {k: v for k, v in content.get("run", {}).items() if k not in remove}
        fin = content.get("fin", {})
        minute = str(int(now // 60))
        for queue, (ok, cx) in credit.items():
            b = fin.setdefault(queue, {}).setdefault(minute, [0, 0])
            b[0] += ok
            b[1] += cx
        new = {"t": content.get("t", now), "run": run, "fin": fin}
        with contextlib.suppress(JetStreamError):  # it wrote meanwhile: next pass
            await link.store.put(self.n.h + holder.encode(), orjson.dumps(new), cur.seq)

    async def _rescue_one(self, link: Link, rec: dict[str, Any], seq: int, now: float) -> bool:
        """Give back a job whose lease ran out: record (with a ``LeaseExpired``
        error) first, then its new pointer, then ``+ACK`` the old delivery.
        True if given back; one out of attempts is buried and kept for
        ``rescue`` to report (and count) as a dead letter instead."""
        env = rec[R.ENV]
        env.setdefault("errors", []).append(lease_error(rec, now))
        if int(env.get("attempt", 0)) >= int(env.get("max_attempts", 1)):
            if await self._bury(link, rec, seq, now):
                self._found_dead.append(_dead_letter(env))
            return False
        jid = str(env["id"])
        gen = R.new_gen()
        reply = str(rec.get(R.ACK) or "")
        new = {
            R.ST: State.READY.value,
            R.ENV: env,
            R.GEN: gen,
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
        if reply:
            with contextlib.suppress(Unavailable):
                link.wire.publish(reply.encode(), b"+ACK")
        return True

    async def _promote(self, link: Link, items: list[Pulled]) -> None:
        """Move due delay entries to the work subjects; hold the others."""
        now = self.clock.now()
        wire = link.wire
        moves: list[tuple[Pulled, asyncio.Future[Reply]]] = []
        longest = min(MAX_HOLD, self.retention / 2)
        for it in items:
            at = float(header(it.hdr, b"Dw-At") or 0)
            if at > now + 0.001:
                if ack_meta(it.reply).delivered > 1:  # held for a while already
                    await self._touch(link, it)
                hold = min(at - now, longest)
                wire.publish(it.reply, b'-NAK {"delay":%d}' % int(hold * _NS_PER_S))
                continue
            parts = it.subject.split(b".")
            queue = untok(parts[-2])
            prio = int(header(it.hdr, b"Dw-P") or 0)
            jid = (header(it.hdr, b"Dw-Id") or b"").decode()
            gen = (header(it.hdr, b"Dw-G") or b"0").decode()
            if prio:
                link.level_seen(queue, prio)
            pairs: list[tuple[bytes, bytes | str | int | float]] = [
                (b"Nats-Msg-Id", f"{jid}:{gen}:due"),
                (b"Dw-Id", jid),
                (b"Dw-G", gen),
                (b"Dw-S", header(it.hdr, b"Dw-S") or b"0"),
                (b"Dw-Rp", header(it.hdr, b"Dw-Rp") or b"0"),
            ]
            if header(it.hdr, b"Dw-Raw") is not None:
                pairs.append((b"Dw-Raw", b"1"))
            hdr = headers(*pairs)
            moves.append((it, wire.request(self.n.pointer(queue, prio), it.data, hdr)))
        await wire.flush()
        for it, fut in moves:
            try:
                pub_ack(await fut, "promote")
            except (JetStreamError, Unavailable, BrokerError):
                log.warning("nats: could not move a due job; it is looked at again", exc_info=True)
                continue
            wire.publish(it.reply, b"+ACK")
        await wire.flush()

    async def _touch(self, link: Link, it: Pulled) -> None:
        """Rewrite a waiting job's index entry, record and unique key, so they
        outlive ``retention`` (JOBS ``max_age``) while the job waits for a far
        ``eta``: the promoter holds each delay entry at most ``retention/2``
        and touches it whenever it comes back not yet due."""
        jid = (header(it.hdr, b"Dw-Id") or b"").decode()
        if not jid:
            return
        store = link.store
        n = self.n
        try:
            cur, fresh = await store.read_many(n.jobs, [n.js + jid.encode(), n.je + jid.encode()])
            if cur is not None:  # the record: the same content, a new time
                with contextlib.suppress(JetStreamError):
                    await store.put(n.js + jid.encode(), cur.data, cur.seq)
            elif fresh is not None:
                extra = tuple(
                    (k, v) for k in (b"Dw-U", b"Dw-Ra") if (v := fresh.get(k)) is not None
                )
                await store.put(n.je + jid.encode(), fresh.data, None, extra)
            env = orjson.loads(it.data)
            key = env.get("key") if isinstance(env, dict) and env.get("kind") == "task" else None
            if key:
                held = await store.read(n.jobs, n.unique(str(key)))
                if held is not None and orjson.loads(held.data).get("id") == jid:
                    with contextlib.suppress(JetStreamError):
                        await store.put(n.unique(str(key)), held.data, held.seq)
        except (Unavailable, BrokerError, orjson.JSONDecodeError):
            log.debug("nats: could not touch waiting job %s", jid, exc_info=True)

    async def publish(self, msgs: Iterable[Message]) -> int:
        events = self._encode(msgs)
        if not events:
            return 0
        link = await self._link()
        table: dict[str, dict[str, int]] = await self._config(link, b"bind") or {}
        deliveries: list[tuple[Message, bytes]] = []
        for m, _ in events:
            for queue, attempts in sorted(table.get(m.name, {}).items()):
                b = Binding(m.name, queue, attempts)
                d = delivery_of(m, b, delivery_id(m.id, queue))
                deliveries.append((d, encode_checked(d, None)))
        made = await self._store_jobs(deliveries) if deliveries else []
        futs = [
            link.wire.request(self.n.event_subject(m.name), body, headers((b"Nats-Msg-Id", m.id)))
            for m, body in events
        ]
        for r in await link.wire.gather(futs):
            if isinstance(r, BaseException):
                raise r
            pub_ack(r, "event")
        return sum(1 for _, new in made if new)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        link = await self._link()
        subject = self.n.event_subject(event_type)
        found = await link.store.scan(
            self.n.events,
            subject,
            start_seq=int(cursor) + 1 if cursor else None,
            start_time=since if not cursor else None,
            limit=None,
        )
        page: list[Message] = []
        last = 0
        more = False
        for m in found:
            if since is not None and m.time < since:
                continue
            if until is not None and m.time > until:
                break
            if len(page) >= limit:
                more = True
                break
            try:
                page.append(from_dict(orjson.loads(m.data)))
            except (MessageDecodeError, orjson.JSONDecodeError):
                continue
            last = m.seq
        return page, (str(last) if more else None)


def _dead_letter(env: dict[str, Any]) -> DeadLetter:
    """The report of a job buried for a lost lease: its envelope (a state
    record's) carries the ``LeaseExpired`` error just appended, and goes with
    the report whole (on_dead hooks log its arguments)."""
    errors = env.get("errors") or [{}]
    try:
        msg: Message | None = from_dict(env)
    except MessageDecodeError:
        msg = None
    return DeadLetter(
        str(env.get("id", "")),
        str(env.get("queue", "") or "?"),
        str(env.get("name", "") or "?"),
        ErrorRecord.from_dict(errors[-1]),
        msg,
    )


#: header "unique" -> the states in which a key's holder blocks a new job (None: every state)
