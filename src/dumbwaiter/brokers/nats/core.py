"""What every part of the NATS broker shares: connections per event loop,
configuration entries, job lookups, pointer publishing and removal.

``NatsBroker`` (broker.py) is ``Core`` + ``Enqueue`` (enqueue.py) +
``Transport`` (transport.py) + ``Rescue`` (rescue.py) + ``Admin`` (admin.py)
+ ``Coordination`` (coordination.py); docs/nats.md describes the
layout they share (names.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import orjson

from ...errors import (
    BrokerAuthError,
    BrokerError,
    BrokerUnavailable,
)
from ...state import State
from .. import failure
from ..base import (
    FOUND_DEAD_LIMIT,
    Broker,
    DeadLetter,
    JobInfo,
)
from ..clock import ServerClock
from ..perloop import PerLoop
from . import records as R
from .connection import LoopLink
from .names import Settings, Subjects, key_tokens, parse_url, tok
from .pointers import _duplicate_of, _next_pointer, fresh_of, live
from .protocol import (
    JetStreamError,
    Reply,
    Unavailable,
    headers,
    pub_ack,
    refused_login,
)
from .puller import Pulled
from .store import Stored, is_conflict, stored

log = logging.getLogger("dumbwaiter.nats")

_NS_PER_S = 1_000_000_000
#: the longest a delay entry is held in one go (entries are looked at again)
MAX_HOLD = 3600.0
#: seconds between kv expiry sweeps (under the maintenance lock)
SWEEP_EVERY = 15.0
#: an expected last sequence no stream reaches: a publish carrying it is never stored
_NEVER = b"9223372036854775807"

Hdrs = tuple[tuple[bytes, bytes | str | int | float], ...]


def _abandon(link: LoopLink) -> None:
    """Let go of a connection whose event loop has closed (``PerLoop``)."""
    link.wire.abandon()


def _client_errors() -> tuple[type[BaseException], ...]:
    """nats-py's exceptions (when it is installed: without it, ``App()``
    already failed) and the socket's."""
    try:
        from nats.errors import Error
    except ImportError:
        return (OSError, asyncio.TimeoutError)
    return (Error, OSError, asyncio.TimeoutError)


class Core(Broker):
    """Connections, shared lookups and pointer bookkeeping (see the module doc)."""

    client_errors = _client_errors()

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """nats-py's (or the wire's) ``exc`` as the ``BrokerError`` it means:
        refused credentials (for good), a server out of reach (for now; an
        ``Unavailable`` is worded again with the time waited), or anything
        else."""
        if isinstance(exc, BrokerError):  # the wire's: worded again, naming the server
            if exc.server is not None and waited is None:
                return exc
            cause = exc.__cause__ or exc
            if isinstance(exc, BrokerAuthError):
                return failure.refused(self.url, cause, auth=True)
            if isinstance(exc, BrokerUnavailable):
                return failure.unavailable(self.url, cause, waited)
            return exc
        if refused_login(exc):
            return failure.refused(self.url, exc, auth=True)
        if isinstance(exc, OSError | asyncio.TimeoutError) or "connection" in str(exc).lower():
            return failure.unavailable(self.url, exc, waited)
        return failure.failed(self.url, exc, "nats")

    async def _promote(self, link: LoopLink, items: list[Pulled]) -> None:
        """Move due delay entries to the work subjects (the transport's part)."""
        raise NotImplementedError

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.settings: Settings = parse_url(url)
        self.n = Subjects(self.settings)
        self.retention = self.settings.retention
        #: the server's clock (the time stamp JetStream gives a write), which
        #: every lease, lock and run time written here is on (``clock.py``)
        self.clock = ServerClock()
        #: each event loop's connection (``brokers/perloop.py``)
        self._links: PerLoop[LoopLink] = PerLoop(
            lambda loop: LoopLink(self, loop), LoopLink.stop, _abandon
        )
        #: jobs this process dead-lettered for a lost lease (at a claim or a
        #: rescue), for the next ``rescue`` to report
        self._found_dead: deque[DeadLetter] = deque(maxlen=FOUND_DEAD_LIMIT)

    def __repr__(self) -> str:
        return f"<NatsBroker {self.n.ns}>"

    async def _link(self) -> LoopLink:
        link = self._links.get()
        if not link.ready:
            try:
                await link.start()
            except BrokerError as exc:  # unreachable, or the login refused
                raise self.failure(exc) from (exc.__cause__ or exc)
        if self.clock.due:
            await self.clock.try_sync(lambda: self._server_time(link))
        return link

    async def server_time(self) -> float | None:
        return await self._server_time(await self._link())

    async def _server_time(self, link: LoopLink) -> float:
        """The server's time: the time stamp of a write of this process's
        own, read back (so it falls between sending the write and the read's
        answer), then deleted: the bucket keeps only what users and the
        broker stored."""
        subject = self.n.c + b"clock." + tok(link.holder.id)
        ack = await link.store.put(subject, b"", None)
        cur = await link.store.read(self.n.kv, subject)
        await link.store.delete(self.n.kv, ack.seq)
        if cur is None or not cur.time:
            raise BrokerError(f"nats: {subject.decode()} has no time stamp")
        return cur.time

    async def open(self) -> None:
        await self._link()

    async def close(self) -> None:
        await self._links.close()

    async def _merge_config(self, link: LoopLink, name: bytes, fn: Any) -> Any:
        out: dict[str, Any] = {}

        async def change(cur: Stored | None) -> tuple[bytes, Hdrs] | None:
            old = orjson.loads(cur.data) if cur is not None and cur.data else None
            new = fn(old)
            out["v"] = new
            if new == old:
                return None
            return orjson.dumps(new), ()

        await link.store.cas(self.n.kv, self.n.c + name, change)
        return out.get("v")

    async def _config(self, link: LoopLink, name: bytes) -> Any:
        cur = await link.store.read(self.n.kv, self.n.c + name)
        return orjson.loads(cur.data) if cur is not None and cur.data else None

    async def _get(self, link: LoopLink, jid: str) -> JobInfo | None:
        s, e = await self._lookup(link, jid)
        now = self.clock.now()
        if s is not None:
            return R.info_of(R.loads(s.data), now)
        if e is not None:
            return fresh_of(e, now)
        kept = await self._kv_read(link, self.n.c + b"res." + jid.encode())
        if kept is not None:
            return R.info_of(R.loads(kept), now)
        return None

    async def _lookup(self, link: LoopLink, jid: str) -> tuple[Stored | None, Stored | None]:
        """A job's state record and, while it has none, its fresh entry: the
        index entry ``j.e.ID`` or the enqueue's pointer itself.

        An enqueue stores only the pointer (docs/nats.md, "The job index"):
        a fresh job is found by its pointer's ``Nats-Msg-Id`` while that is
        inside the de-duplication window, and by the index entry the
        catch-up (``_index_fresh``) writes for every pointer older than half
        the window.  Jobs enqueued before that change (and delayed jobs)
        have their index entry from the enqueue.  Read in the order that
        never misses a job: the record is written before the pointer goes,
        and an index entry stays (retention), so a job missing from the
        record, the index and the work stream in turn has a record when it
        is read again."""
        n = self.n
        jb = jid.encode()
        store = link.store
        rec, idx = await store.read_many(n.jobs, [n.js + jb, n.je + jb])
        if rec is not None:
            return rec, idx
        if idx is not None:
            return None, idx if self._index_live(idx) else None
        r = await self._await(link, self._probe_req(link, jb))
        seq = _duplicate_of(r)
        if seq:
            m = stored(await link.wire.call(self._direct_work, b'{"seq":%d}' % seq))
            if (
                m is not None
                and m.subject.startswith(n.w)
                and m.get(b"Dw-Id") == jb
                and (m.get(b"Dw-G") or b"0") == b"0"
            ):
                return None, m
        else:  # older than the window: index what is (see _index_fresh)
            await self._index_fresh(link, self.clock.now() - self.settings.dupe_window / 2, want=jb)
        rec, idx = await store.read_many(n.jobs, [n.js + jb, n.je + jb])
        return rec, idx if rec is not None or idx is None or self._index_live(idx) else None

    def _index_live(self, e: Stored) -> bool:
        """Whether a fresh job's index entry still counts: not ``retention``
        past the job's enqueue (or its ``eta``), as when every entry was
        written at the enqueue.  An entry written late (by the catch-up,
        while the job ran and finished) would otherwise outlive the job's
        record and show it as waiting."""
        at = max(float(e.get(b"Dw-U") or 0), float(e.get(b"Dw-Ra") or 0))
        return at + self.retention > self.clock.now()

    @property
    def _direct_work(self) -> bytes:
        return b"$JS.API.DIRECT.GET." + self.n.work.encode()

    def _probe_req(self, link: LoopLink, mid: bytes) -> asyncio.Future[Reply]:
        """A publish that is never stored (``Nats-Expected-Last-Sequence``
        beyond any sequence) carrying ``Nats-Msg-Id`` ``mid``: the server
        answers "duplicate of sequence N" while ``mid`` is inside the work
        stream's de-duplication window (it checks duplicates first)."""
        return link.wire.request(
            self.n.t + b"probe",
            b"",
            headers((b"Nats-Msg-Id", mid), (b"Nats-Expected-Last-Sequence", _NEVER)),
        )

    async def _index_fresh(
        self,
        link: LoopLink,
        bound: float | None,
        budget: float | None = None,
        want: bytes | None = None,
    ) -> None:
        """Write the index entry of every fresh job's pointer stored before
        ``bound`` (server time; None: all), from the namespace's index cursor
        on, and move the cursor past them.

        The cursor (config entry ``c.idx``) is a work-stream sequence below
        which every fresh pointer has its index entry: entries are written
        (and acknowledged) before the cursor moves, by whoever gets there
        first (the rescuer every second, for pointers older than half the
        de-duplication window; a ``get`` that finds a job neither by record
        nor by ``Nats-Msg-Id``; every listing, for all of them).  Each
        pointer is indexed about once, the work an enqueue used to do for
        every job, now only for jobs that wait.  The reads are direct gets:
        a consumer would take pointers off a work-queue stream.  With a
        ``budget`` (seconds: the rescuer's, which shares the worker's loop)
        it stops after that long and leaves the rest for the next pass; with
        ``want`` (a job id: a ``get``'s) it stops once that job's entry is
        written."""
        deadline = None if budget is None else time.monotonic() + budget
        n = self.n
        wire = link.wire
        path = self._direct_work
        cursor = int(await self._config(link, b"idx") or 0)
        seq = max(cursor, 1)  # every fresh pointer below ``seq`` has its entry
        span = 128  # messages read per round trip: more while they are dense
        while True:
            first = stored(await wire.call(path, _next_pointer(n, seq)))
            if first is None:
                if seq > 1:  # a work stream made anew starts at 1 again
                    info = await wire.api(f"STREAM.INFO.{n.work}")
                    if int(info["state"].get("last_seq", 0)) + 1 < seq:
                        seq = 1
                        continue
                break  # nothing at or after ``seq``: it stays (more may come)
            if bound is not None and first.time > bound:
                seq = first.seq
                break
            seq, stopped, dense = await self._index_from(link, first, bound, span, want)
            span = min(span * 2, 1024) if dense else max(span // 4, 1)
            if stopped or (deadline is not None and time.monotonic() > deadline):
                break
        if seq != cursor:
            # the cursor only moves forward, except for a stream made anew
            await self._merge_config(
                link, b"idx", lambda c: seq if seq < cursor or not c else max(int(c), seq)
            )

    async def _index_from(
        self, link: LoopLink, first: Stored, bound: float | None, span: int, want: bytes | None
    ) -> tuple[int, bool, bool]:
        """Index the fresh pointers from ``first`` over ``span`` sequences
        (pipelined: a backlog is mostly consecutive pointers; gaps, acked
        pointers or other subjects, are skipped).  Returns the sequence below
        which all are done, whether a pointer newer than ``bound`` stopped
        it (or the job ``want``, once its entry is written), and whether most
        of the sequences were messages."""
        n = self.n
        wire = link.wire
        path = self._direct_work
        start = first.seq
        futs = [wire.request(path, b'{"seq":%d}' % s) for s in range(start + 1, start + span)]
        got: list[Stored | None] = [first]
        for r in await wire.gather(futs):
            got.append(stored(r) if isinstance(r, Reply) else None)
        while got[-1] is None:  # trailing gaps may be sequences not stored yet
            got.pop()
        writes: list[asyncio.Future[Reply]] = []
        done, stopped = start + len(got), False
        for k, m in enumerate(got):
            if m is None or not m.subject.startswith(n.w):
                continue
            t = m.time
            if bound is not None and t > bound:
                done, stopped = start + k, True
                break
            jid = m.get(b"Dw-Id")
            if jid and m.get(b"Nats-Msg-Id") == jid:  # an enqueue's (not a promoted eta)
                hdrs = ((b"Dw-U", repr(t)), (b"Dw-Ra", b"0"))
                writes.append(link.store.put_req(n.je + jid, m.data, None, hdrs))
                if jid == want:
                    done, stopped = start + k + 1, True
                    break
        for r in await wire.gather(writes):
            if isinstance(r, BaseException):
                raise r
            pub_ack(r, "index")
        return done, stopped, sum(m is not None for m in got) * 2 > span

    def _kv_subject(self, key: str) -> bytes:
        return self.n.k + key_tokens(key)

    async def _kv_read(self, link: LoopLink, subject: bytes) -> bytes | None:
        cur = await link.store.read(self.n.kv, subject)
        return live(cur, self.clock.now())

    async def _holders(self, link: LoopLink) -> list[tuple[str, Stored, dict[str, Any]]]:
        subjects = await link.store.subjects(self.n.hold, self.n.h + b"*")
        names = sorted(subjects)
        out = []
        for subject, cur in zip(names, await link.store.read_many(self.n.hold, names), strict=True):
            if cur is not None and cur.data:
                out.append((subject[len(self.n.h) :].decode(), cur, orjson.loads(cur.data)))
        return out

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

    @staticmethod
    async def _await(link: LoopLink, fut: asyncio.Future[Reply]) -> Reply:
        await link.wire.flush()
        return await fut

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
