"""The producer's side on RabbitMQ: ``declare``, ``enqueue``, ``publish``
and ``list_events``.

An enqueue writes each job's record in the state store *while* its copy
is published and confirmed (``_enqueue_one``), so it takes the longer of
the two, not their sum; both carry one token of the call, so a copy whose
record another call wrote is dropped by the worker (``ledger.py``).  An
event is one copy that RabbitMQ fans out to the bound group queues, with a
record per group written first, and a log entry kept ``event_retention``
for ``list_events``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import orjson
from pamqp import commands as spec

from ...errors import BrokerError
from ...message import TASK, Message, encode_checked, from_dict
from ...state import State
from ..record import Record, delivery_id, new_record
from ..types import Binding, delivery_of, events_page
from . import topology as topo
from .connection import SEND_ERRORS
from .ledger import KEY_ROUNDS, RabbitMQLedger
from .link import AMQP_ERRORS

log = logging.getLogger("dumbwaiter.rabbitmq")

#: ``_key_holder``: the key changed hands between its read and its update
_AGAIN = "again"
_Taken = tuple[dict[str, bytes], str | None]
T = TypeVar("T")
#: header "unique" -> the states in which a key's holder blocks a new job with that key
_UNIQUE_BLOCKS = {
    "active": frozenset({State.SCHEDULED, State.READY, State.RETRYING, State.RUNNING}),
    "queued": frozenset({State.SCHEDULED, State.READY, State.RETRYING}),
}


class RabbitMQEnqueue(RabbitMQLedger):
    """The seam's producer methods on RabbitMQ (mixed into ``RabbitMQBroker``)."""

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        link = await self._link()
        try:
            for q in {*queues, *(b.queue for b in bindings)}:
                await self._declare_queue(link, q)
            ch = link.channel()
            for b in bindings:
                exchange = await self._events_exchange(link, b.pattern)
                args: dict[str, Any] | None = None
                rk = b.pattern
                if self.exchange_type == "headers":
                    args, rk = {"x-match": "all", "dw-type": b.pattern}, ""
                elif self.exchange_type == "fanout":
                    rk = ""
                await ch.queue_bind(
                    self.names.lane(b.queue), exchange, routing_key=rk, arguments=args
                )
        except AMQP_ERRORS as exc:
            raise await self._failed(link, "declare", exc) from exc
        if bindings:
            await self.state.kv_set(
                {
                    f"{self.keys.binding}{b.queue}\x1f{b.pattern}": str(b.max_attempts).encode()
                    for b in bindings
                }
            )
            known = {(b.pattern, b.queue): b for b in self._bindings}
            known.update({(b.pattern, b.queue): b for b in bindings})
            self._bindings = list(known.values())

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        batch = [(m, encode_checked(m, self.max_message_size)) for m in msgs]
        if not batch:
            return []
        now = await self._now()
        k = self.keys
        if len(batch) == 1 and (batch[0][0].key is None or batch[0][0].kind != TASK):
            return [await self._enqueue_one(*batch[0], now)]
        existing = await self.state.kv_get([k.job + m.id for m, _ in batch])
        enq = os.urandom(8).hex()
        ids: list[str] = []
        fresh: list[tuple[Record, bytes]] = []
        taken_keys: dict[str, str] = {}
        seen: set[str] = set()
        for m, raw in batch:
            if k.job + m.id in existing or m.id in seen:
                ids.append(m.id)
                continue
            if m.key is not None and m.kind == TASK:
                holder = taken_keys.get(m.key) or await self._key_holder(m, now)
                if holder is not None:
                    ids.append(holder)
                    continue
                taken_keys[m.key] = m.id
            due = max(now, self.clock.to_server(m.eta)) if m.eta is not None else now
            state = State.SCHEDULED if due > now else State.READY
            fresh.append((Record(msg=m, state=state, run_at=due, updated_at=now, enq=enq), raw))
            seen.add(m.id)
            ids.append(m.id)
        if not fresh:
            return ids
        written = {k.job + r.msg.id: r.dump() for r, _ in fresh}
        # The records are written while the copies are published, as in
        # ``_enqueue_one``, with this call's token in both: a copy of an id
        # another call wrote meanwhile (the check above is a read) runs only
        # if the record is this call's.
        store = asyncio.ensure_future(_after_send(self.state.kv_set, written))
        try:
            await self._send([self._copy(r.msg, 0, r.run_at, raw, enq) for r, raw in fresh], True)
        except BaseException:
            # nothing of the batch may stay: forget the records and keys
            try:
                await store
            except BaseException:
                log.exception("could not write the records of a failed enqueue")
            try:
                await self.state.kv_delete([*written, *(k.key + key for key in taken_keys)])
            except Exception:
                log.exception("could not forget the records of a failed enqueue")
            raise
        await store  # raises if they could not be written (see ``_enqueue_one``)
        return ids

    async def _enqueue_one(self, m: Message, raw: bytes, now: float) -> str:
        """One job without a unique key (the usual producer call): its record
        is added (only if absent: the same call checks for a duplicate id)
        *while* its copy is published and confirmed, and the call returns when
        both are done, so it takes the longer of the two, not their sum, and
        ``get(id)`` after it finds the job.

        The record and the copy carry one token of this call (``Record.enq``,
        the copy's ``dw-e`` header): a worker drops the copy if the record
        it finds holds another call's token (``_other_enqueue``).  So a
        second enqueue of an existing id, whose ``kv_add`` loses, leaves a
        copy that is dropped and never runs with its own arguments; it
        returns the id, as when the record was written first.  A copy that
        reaches a worker before its record commits waits in the worker,
        judged again after a fraction of a millisecond and then more
        (``FIRST_RECHECK``, ``LOCAL_GRACE``), and past that the
        ``RECORD_GRACE`` rule: a producer that died between the copy's
        confirm and the record's commit leaves a copy that runs once, from
        itself; one that died after the record and before the publish leaves
        a record without a copy (its call never returned), which the
        reconcile sends again (``_reconcile``).
        """
        due = max(now, self.clock.to_server(m.eta)) if m.eta is not None else now
        enq = os.urandom(8).hex()
        record = new_record(raw, State.SCHEDULED if due > now else State.READY, due, now, enq)
        key = self.keys.job + m.id
        copy = self._copy(m, 0, due, raw, enq)
        link = self._links.get()
        started = None
        if self._claimed.get(link) == link.gen:
            try:
                started = await link.start_one(copy)
            except SEND_ERRORS as exc:  # nothing sent: ``_send`` tries again
                log.debug("rabbitmq publish failed (%r); sending again", exc)
        if started is None:
            # written while RabbitMQ (a quorum queue: its log's commit)
            # confirms the copy, so it normally commits long before the
            # copy is handed out
            add = asyncio.ensure_future(_after_send(self.state.kv_add, key, record))
            try:
                await self._send([copy], True)
            except BaseException as exc:
                return await self._unsent(m, key, add, exc)
            await add  # raises if the record could not be written
            return m.id
        # The usual call (a lane this connection published to): the copy's
        # frames wait for aiormq's writer task, which one turn of the loop
        # puts on the socket; then the record is written here, without a
        # task, while RabbitMQ confirms the copy.
        failed: BaseException | None = None
        ours = False
        try:
            await asyncio.sleep(0)
            ours = await self.state.kv_add(key, record)
        except BaseException as exc:
            failed = exc
            if not isinstance(exc, Exception):  # cancelled: the outcome is unknown
                return await self._unsent(m, key, _outcome(ours, failed), exc)
        try:
            try:
                await link.confirm_one(started)
            except SEND_ERRORS as exc:  # again, on a new connection if need be
                log.debug("rabbitmq publish failed (%r); sending again", exc)
                await self._failed(link, "publish", exc)
                await self._send([copy], True)
        except BaseException as exc:
            return await self._unsent(m, key, _outcome(ours, failed), exc)
        if failed is not None:
            raise failed  # the record could not be written (see above)
        return m.id

    async def _unsent(
        self, m: Message, key: str, written: Awaitable[bool], exc: BaseException
    ) -> str:
        """The end of a single enqueue whose copy could not be sent: forget its
        record if this call wrote it, and raise; the id if the record was
        another enqueue's (the failed copy was a duplicate's)."""
        try:
            ours = await written
        except BaseException:
            ours = False  # not written: nothing to forget, the send's error stands
            log.exception("could not write the record of a failed enqueue")
        else:
            if not ours and isinstance(exc, Exception):
                return m.id  # enqueued before: the failed copy was a duplicate's
        if ours:
            try:
                await self.state.kv_delete([key])
            except Exception:
                log.exception("could not forget the record of a failed enqueue")
        raise exc

    async def _key_holder(self, m: Message, now: float) -> str | None:
        """The id of the job holding ``m.key`` (None: the key is now ``m``'s).

        A held key is taken over (its holder is gone or done) in one
        ``kv_update`` of the key's entry and its holder's record, only if
        the entry still names the holder read: two producers that both
        found the holder done cannot both take the key (each stored its job,
        a duplicate), and the one that comes second reads the new holder."""
        assert m.key is not None
        kk = self.keys.key + m.key
        blocks = _UNIQUE_BLOCKS.get(m.headers.get("unique", ""), frozenset(State))
        for _ in range(KEY_ROUNDS):
            if await self.state.kv_add(kk, m.id.encode()):
                return None
            holder = (await self.state.kv_get([kk])).get(kk, b"").decode()
            rk = self.keys.job + holder

            def decide(got: dict[str, bytes], holder: str = holder, rk: str = rk) -> _Taken:
                if got.get(kk, b"").decode() != holder:
                    return {}, _AGAIN  # taken over or freed since the read: read again
                raw = got.get(rk) if holder else None
                if raw is not None and Record.load(raw).shown_state(now) in blocks:
                    return {}, holder
                return {kk: m.id.encode()}, None  # the holder is gone or done

            taken = await self.state.kv_update([kk, rk] if holder else [kk], decide)
            if taken is not _AGAIN:
                return taken
        raise BrokerError(f"rabbitmq enqueue: the unique key {m.key!r} kept changing hands")

    # -- events ---------------------------------------------------------------------------

    async def publish(self, msgs: Iterable[Message]) -> int:
        batch = [(m, encode_checked(m, self.max_message_size)) for m in msgs]
        if not batch:
            return 0
        k = self.keys
        log_keys = [k.log_prefix(m.name) + m.id for m, _ in batch]
        existing = await self.state.kv_get(log_keys)
        fresh: list[tuple[Message, bytes]] = []
        seen: set[str] = set()
        for (m, raw), lk in zip(batch, log_keys, strict=True):
            if lk not in existing and m.id not in seen:
                seen.add(m.id)
                fresh.append((m, raw))
        if not fresh:
            return 0
        bindings = await self._load_bindings()
        now = await self._now()
        logged: dict[str, bytes] = {}
        records: dict[str, bytes] = {}
        copies: list[tuple[str, str, bytes, spec.Basic.Properties]] = []
        n = 0
        link = await self._link()
        for e, raw in fresh:
            logged[k.log_prefix(e.name) + e.id] = orjson.dumps({"m": e.to_dict(), "at": now})
            targets = [b for b in bindings if topo.topic_matches(b.pattern, e.name)]
            due = max(now, self.clock.to_server(e.eta)) if e.eta is not None else now
            dms = [delivery_of(e, b, delivery_id(e.id, b.queue)) for b in targets]
            for dm in dms:
                state = State.SCHEDULED if due > now else State.READY
                rec = Record(msg=dm, state=state, run_at=due, updated_at=now)
                records[k.job + dm.id] = rec.dump()
            n += len(dms)
            if due <= now and e.priority == 0:
                # one copy; RabbitMQ fans it out to the bound group queues
                try:
                    exchange = await self._events_exchange(link, e.name)
                except AMQP_ERRORS as exc:
                    raise await self._failed(link, "publish", exc) from exc
                props = spec.Basic.Properties(
                    content_type="application/json",
                    delivery_mode=2,
                    message_id=e.id,
                    headers={"dw-type": e.name},
                )
                rk = e.name if self.exchange_type in ("topic", "direct") else ""
                copies.append((exchange, rk, raw, props))
            else:  # delayed or prioritised: one copy per group, through its lane
                copies += [self._copy(dm, 0, due) for dm in dms]
        await self.state.kv_set(logged, ttl=self.event_retention)
        if records:
            await self.state.kv_set(records)
        try:
            await self._send(copies, True)
        except BaseException:
            try:
                await self.state.kv_delete([*logged, *records])
            except Exception:
                log.exception("could not forget the records of a failed publish")
            raise
        return n

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        logged = [
            (float(d["at"]), from_dict(d["m"]))
            for d in map(
                orjson.loads, (await self.state.kv_scan(self.keys.log_prefix(event_type))).values()
            )
        ]
        return events_page(logged, since, until, cursor, limit)


async def _outcome(ours: bool, failed: BaseException | None) -> bool:
    """A record's write that is over, as ``_unsent`` awaits it."""
    if failed is not None:
        raise failed
    return ours


async def _after_send(write: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``write(*args)`` once the event loop has had one turn.

    Started as a task right before the publish: the publish queues its
    frames for aiormq's writer task, which runs in the loop's next turn, and
    this task's first turn would come before it.  A state store that writes
    on the caller's thread (SQLite's quick path) would then hold the frames
    back for the length of its write; one turn later they are on the socket
    and the write overlaps the broker's confirm instead of preceding it."""
    await asyncio.sleep(0)
    return await write(*args)
