"""producer side of the NATS broker: ``declare``, ``enqueue`` (one
pointer per job, pipelined), task keys, ``publish`` and ``list_events``
(docs/nats.md, "Enqueue")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from ...errors import BrokerError, BrokerUnavailable, MessageDecodeError
from ...message import Message, encode_checked, from_dict
from ..deadline import Backoff
from ..types import Binding, delivery_of
from .connection import LoopLink
from .index import Index
from .pointers import (
    UNIQUE_BLOCKS,
    delivery_id,
)
from .protocol import (
    JetStreamError,
    Reply,
    Unavailable,
    headers,
    pub_ack,
)
from .store import is_conflict, stored

log = logging.getLogger("dumbwaiter.nats")
#: publishes handed to the socket at a time by a bulk enqueue
SEND_CHUNK = 512


def _retrieved(fut: asyncio.Future[Reply]) -> None:
    if not fut.cancelled():
        fut.exception()


class Enqueue(Index):
    """The producer side (see the module doc)."""

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
            self._bindings = None  # the next publish reads them first
        n = self.n
        for q in queues:  # the consumers only: a producer that declares never pulls
            await link.consumer(n.consumer(q, 0), n.pointer(q, 0), self.settings.ack_wait)

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        prepared = self._encode(msgs)
        if len(prepared) == 1:
            # A request handler's single enqueue on this loop's connected
            # link: straight to ``_store_one``, without the three coroutines
            # of ``_store_jobs`` -> ``_link`` -> ``_store_once``, which cost
            # a busy producer (docs/benchmarks.md, "Figures behind the NATS
            # engine's choices").  The same conditions as ``_store_once``'s;
            # when NATS is unreachable the general path below retries (the
            # publish is idempotent: its Nats-Msg-Id is the job's id).
            m, body = prepared[0]
            link = self._links.get()
            if link.ready and m.queue in link.queues and (m.key is None or m.kind != "task"):
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
        self, link: LoopLink, prepared: list[tuple[Message, bytes]]
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

    async def _store_one(
        self, link: LoopLink, m: Message, body: bytes, now: float
    ) -> tuple[str, bool]:
        """``_store_once`` for the usual single enqueue (a request handler's
        ``aenqueue``: a known queue, no key, due now): the same publish and
        the same headers, without what a batch of many needs (queue and
        key checks, delay entries, chunks, reply lists): bookkeeping a
        producer with many handlers enqueuing at once pays per job
        (docs/benchmarks.md, "Figures behind the NATS engine's choices")."""
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
        link: LoopLink,
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

    async def _claim_key(self, link: LoopLink, m: Message) -> str | None:
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

    async def publish(self, msgs: Iterable[Message]) -> int:
        """Deliveries for the bound groups, then the events, in one round
        trip where it can (``_publish_one_trip``), else one step after the
        other (``_publish_in_steps``)."""
        events = self._encode(msgs)
        if not events:
            return 0
        link = await self._link()
        known = self._bindings
        if known is not None:
            deliveries = self._deliveries(events, known[1])
            now = self.clock.now()
            if all(self._due_known(link, d, now) for d, _ in deliveries):
                try:
                    return await self._publish_one_trip(link, events, deliveries, known[0])
                except Unavailable:
                    pass  # (every write here is idempotent: the steps retry them)
        return await self._publish_in_steps(link, events)

    @staticmethod
    def _deliveries(
        events: list[tuple[Message, bytes]], table: dict[str, dict[str, int]]
    ) -> list[tuple[Message, bytes]]:
        out: list[tuple[Message, bytes]] = []
        for m, _ in events:
            for queue, attempts in sorted(table.get(m.name, {}).items()):
                d = delivery_of(m, Binding(m.name, queue, attempts), delivery_id(m.id, queue))
                out.append((d, encode_checked(d, None)))
        return out

    def _due_known(self, link: LoopLink, m: Message, now: float) -> bool:
        """A delivery ``_store_one`` would store: a known queue, due now."""
        return m.queue in link.queues and (m.eta is None or self.clock.to_server(m.eta) <= now)

    def _read_bindings(self, r: Reply) -> tuple[int, dict[str, dict[str, int]]]:
        """The bindings table of a direct get's reply, kept as the process'
        copy with the sequence it was stored at."""
        cur = stored(r)
        table = orjson.loads(cur.data) if cur is not None and cur.data else None
        known = (cur.seq if cur is not None else 0, table or {})
        self._bindings = known
        return known

    async def _publish_in_steps(self, link: LoopLink, events: list[tuple[Message, bytes]]) -> int:
        """Read the bindings, store the deliveries (retried while NATS is
        unreachable), then publish the events: three round trips."""
        _, table = self._read_bindings(
            await link.wire.call(self.n.direct(self.n.kv, self.n.c + b"bind"), b"")
        )
        deliveries = self._deliveries(events, table)
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

    async def _publish_one_trip(
        self,
        link: LoopLink,
        events: list[tuple[Message, bytes]],
        deliveries: list[tuple[Message, bytes]],
        seq: int,
    ) -> int:
        """One pipelined round trip: a read of the bindings table, the
        deliveries for the groups this process knows of (the same publishes
        as ``_store_one``'s), then the events.

        The table is shared state every host must agree on, so the copy
        only saves the wait for it, never the read: the read is sent with
        the writes, after ``publish`` was called, so it sees every binding
        whose ``declare`` returned before (by any process); if it shows a
        group the copy did not have, that group's deliveries are stored
        before this returns (a second round trip, once per change).  A
        group's ``max_attempts`` changed by another process reaches the
        deliveries of that group from the next ``publish`` on: a delivery
        sent with the old one keeps it (its id is taken)."""
        wire = link.wire
        read = wire.request(self.n.direct(self.n.kv, self.n.c + b"bind"), b"")
        items: list[tuple[bytes, bytes, bytes | None]] = []
        subjects = link.subjects
        for d, body in deliveries:
            subject = subjects.get((d.queue, d.priority))
            if subject is None:
                subject = subjects[(d.queue, d.priority)] = self.n.pointer(d.queue, d.priority)
                if d.priority:
                    link.level_seen(d.queue, d.priority)
            mid = d.id.encode()
            hdr = b"NATS/1.0\r\nNats-Msg-Id: %s\r\nDw-Id: %s\r\nDw-G: 0\r\n\r\n" % (mid, mid)
            items.append((subject, body, hdr))
        for m, body in events:
            items.append((self.n.event_subject(m.name), body, headers((b"Nats-Msg-Id", m.id))))
        batch = wire.batch(items)
        await wire.flush()
        try:
            replies = await batch.wait()
            got = await read
        except BaseException:
            read.add_done_callback(_retrieved)  # (failed with the batch: no warning)
            raise
        now_seq, table = self._read_bindings(got)
        made = 0
        for r in replies[: len(deliveries)]:
            made += not pub_ack(r, "pointer").duplicate
        for r in replies[len(deliveries) :]:
            pub_ack(r, "event")
        if now_seq != seq:
            sent = {(d.name, d.queue) for d, _ in deliveries}
            late = [
                (d, body)
                for d, body in self._deliveries(events, table)
                if (d.name, d.queue) not in sent
            ]
            if late:
                made += sum(1 for _, new in await self._store_jobs(late) if new)
        return made

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
