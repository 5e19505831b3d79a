"""Finding a job on NATS: its state record, its index entry, or (for a job
nobody has touched yet) the enqueue's pointer itself, and the catch-up that
writes the index entries of fresh jobs that wait; docs/nats.md, "The job
index".
"""

from __future__ import annotations

import asyncio
import time

from ..types import JobInfo
from . import records as R
from .connection import LoopLink
from .core import Core
from .pointers import _duplicate_of, _next_pointer, fresh_of
from .protocol import Reply, headers, pub_ack
from .store import Stored, stored

#: an expected last sequence no stream reaches: a publish carrying it is never stored
_NEVER = b"9223372036854775807"


class Index(Core):
    """Job lookups and the fresh jobs' index (see the module doc)."""

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
