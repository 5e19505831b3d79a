"""Looking at and acting on stored jobs on Redis (the seam's admin part):
counts, pages of jobs, replay, purge, cancel, reschedule, pause.

Admin walks are bounded: each script call looks at ``WALK_BUDGET`` jobs at
most (fewer for a search by key, which reads bodies), and returns a cursor,
so no call holds the server for long however many jobs an app keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from redis.exceptions import RedisError

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message
from ...state import State
from ..base import Broker
from ..finished import compact_message
from ..types import JobFilter, JobInfo, Page, QueueStats, normalize_error_type
from .connection import Arg, Connection
from .lua import Script, Scripts
from .transport import HOUSEKEEPING_CHUNK, message

#: jobs an admin walk looks at per call, at most (one call stays short)
WALK_BUDGET = 10_000
#: the same for a search by key, which reads each unheld job's body too
KEY_WALK_BUDGET = 2_000
#: fields of a job as ``get`` and ``list`` read them
_INFO = (b"body", b"q", b"st", b"a", b"err", b"ra", b"u", b"w", b"lu", b"res", b"rp", b"n", b"s")
#: fields per job of a page (the id, then ``_INFO``)
_ROW = 1 + len(_INFO)
#: compact records a listing looks at, the newest finished (list_fin.lua)
FIN_BUDGET = 10_000


class Admin(Broker):
    """The seam's admin methods on Redis (mixed into ``RedisBroker``)."""

    conn: Connection
    lua: Scripts
    retention: float

    async def stats(self) -> list[QueueStats]:
        now = await self.conn.now()
        r = await self.conn.run(self.lua.stats, [repr(now)])
        out = []
        for i in range(0, len(r), 10):
            q, ready, sched, retrying, running, dead, ok, cancelled, paused, oldest = r[i : i + 10]
            retrying = int(retrying)
            out.append(
                QueueStats(
                    queue=q.decode(),
                    ready=int(ready),
                    scheduled=int(sched) - retrying,
                    retrying=retrying,
                    running=int(running),
                    dead=int(dead),
                    succeeded=int(ok),
                    cancelled=int(cancelled),
                    lag=max(0.0, now - int(oldest) / 1e6) if oldest else 0.0,
                    paused=bool(int(paused)),
                )
            )
        return out

    def _walk_args(self, f: JobFilter, index: str, cursor: str | None, limit: int) -> list[Arg]:
        args: list[Arg] = [
            repr(self.conn.clock.now()),
            cursor or "",
            limit,
            WALK_BUDGET if f.key is None else KEY_WALK_BUDGET,
            f.queue or "",
            f.name or "",
            str(f.state) if f.state is not None else "",
            normalize_error_type(f.error_type) if f.error_type is not None else "",
            repr(self.conn.clock.to_server(f.since)) if f.since is not None else "",
            repr(self.conn.clock.to_server(f.until)) if f.until is not None else "",
            f.key if f.key is not None else "",
        ]
        if f.ids is not None:
            ids = sorted(set(f.ids), reverse=True)
            if cursor:
                ids = [i for i in ids if i < cursor]
            return [*args, "given", *ids]
        return [*args, index]

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        if filter.ids is not None and not filter.ids:
            return Page()
        index = "dead" if filter.state is State.DEAD else "ids"
        items: list[JobInfo] = []
        await self.conn.read_clock()  # for _walk_args
        if _has_compact(filter):
            return await self._with_compact(filter, cursor, limit)
        while True:
            args = self._walk_args(filter, index, cursor, limit - len(items))
            r = await self.conn.run(self.lua.list, args)
            items += _infos(r)
            cursor = r[0].decode() or None
            # A key search reads bodies and matches few jobs, so one call's
            # budget (KEY_WALK_BUDGET jobs) may end with an empty page and a
            # cursor: go on, one bounded call at a time, until the page is
            # full or the index is exhausted, so a search over many jobs
            # answers in one page instead of a trail of empty ones.
            if filter.key is None or cursor is None or len(items) >= limit:
                return Page(items=items, cursor=cursor)

    async def _with_compact(self, f: JobFilter, cursor: str | None, limit: int) -> Page:
        """A page of the id index merged with the compact records (which are
        in no id index), newest id first, paged by ``id < cursor`` as every
        listing is.  Only the newest ``FIN_BUDGET`` compact records are
        looked at: a listing of succeeded jobs shows the recent ones."""
        r = await self.conn.run(self.lua.list, self._walk_args(f, "ids", cursor, limit))
        fin = await self.conn.run(
            self.lua.list_fin,
            [
                cursor or "",
                limit,
                FIN_BUDGET,
                f.queue or "",
                f.name or "",
                repr(self.conn.clock.to_server(f.since)) if f.since is not None else "",
                repr(self.conn.clock.to_server(f.until)) if f.until is not None else "",
            ],
        )
        walked = r[0].decode() or None  # the id index is read down to here
        compact = [_info(fin[i], fin[i + 1 : i + _ROW]) for i in range(0, len(fin), _ROW)]
        if walked is not None:
            compact = [i for i in compact if i.message.id > walked]
        items = sorted([*_infos(r), *compact], key=lambda i: i.message.id, reverse=True)
        if len(items) > limit:
            return Page(items=items[:limit], cursor=items[limit - 1].message.id)
        return Page(items=items, cursor=walked)

    async def get(self, id: str) -> JobInfo | None:
        try:
            v = await self.conn.links.get().call(b"HMGET", self.conn.keys.job(id), *_INFO)
        except RedisError as exc:
            raise self.conn.failure(exc, "get") from exc
        if v[2] is None or v[2] == b"staged":  # staged: not enqueued yet (see bulk.py)
            return None
        return _info(id.encode(), v)

    async def _walk(self, script: Script, f: JobFilter, index: str) -> int:
        """Run replay or purge over every match, one bounded call at a time."""
        await self.conn.read_clock()  # for _walk_args
        if f.ids is not None:
            ids = sorted(set(f.ids), reverse=True)
            n = 0
            for i in range(0, len(ids), HOUSEKEEPING_CHUNK):
                part = JobFilter(**{**_fields(f), "ids": tuple(ids[i : i + HOUSEKEEPING_CHUNK])})
                args = self._walk_args(part, index, None, HOUSEKEEPING_CHUNK)
                n += int((await self.conn.run(script, args))[1])
            return n
        cursor: str | None = None
        n = 0
        while True:
            r = await self.conn.run(script, self._walk_args(f, index, cursor, HOUSEKEEPING_CHUNK))
            n += int(r[1])
            cursor = r[0].decode() or None
            if cursor is None:
                return n

    async def replay(self, filter: JobFilter) -> int:
        if filter.state is not None and filter.state is not State.DEAD:
            return 0
        return await self._walk(self.lua.replay, filter, "dead")

    async def purge(self, filter: JobFilter) -> int:
        index = "dead" if filter.state is State.DEAD else "ids"
        return await self._walk(self.lua.purge, filter, index)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        now = await self.conn.now()
        r = await self.conn.run(self.lua.cancel, [repr(now), repr(now + self.retention), *ids])
        return [i.decode() for i in r]

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        if not ids:
            return []
        now = await self.conn.now()
        at = self.conn.clock.to_server(at)
        r = await self.conn.run(self.lua.reschedule, [repr(now), repr(at), *ids])
        return [i.decode() for i in r]

    async def pause(self, queue: str) -> None:
        await self.conn.run(self.lua.pause, [repr(await self.conn.now()), queue, b"1"])

    async def resume(self, queue: str) -> None:
        await self.conn.run(self.lua.pause, [repr(await self.conn.now()), queue, b"0"])


# -- replies -------------------------------------------------------------------


def _fields(f: JobFilter) -> dict[str, Any]:
    return {
        "queue": f.queue,
        "name": f.name,
        "state": f.state,
        "error_type": f.error_type,
        "since": f.since,
        "until": f.until,
        "ids": f.ids,
        "key": f.key,
    }


def _opt_float(v: bytes | None) -> float | None:
    return float(v) if v else None


def _has_compact(f: JobFilter) -> bool:
    """Whether compact records (succeeded, no key, no error) may match ``f``."""
    return (
        f.state in (None, State.SUCCEEDED)
        and f.error_type is None
        and f.key is None
        and f.ids is None
    )


def _infos(r: Sequence[Any]) -> list[JobInfo]:
    """The jobs of a list.lua reply (a cursor, then ``_ROW`` fields per job)."""
    return [_info(r[i], r[i + 1 : i + _ROW]) for i in range(1, len(r), _ROW)]


def _info(id_: bytes, v: Sequence[Any]) -> JobInfo:
    body, q, st, a, err, ra, u, w, lu, res, rp, n, s = v
    queue, attempt = q.decode(), int(a or 0)
    if not body and st == b"succeeded":  # a compact record (see ack.lua)
        fin = _opt_float(u)
        return JobInfo(
            message=compact_message(id_.decode(), (n or b"?").decode(), queue, attempt or 1),
            state=State.SUCCEEDED,
            updated_at=fin,
            result=orjson.dumps({"started": float(s), "finished": fin}) if s and fin else None,
            replays=int(rp or 0),
            compact=True,
        )
    raw = None
    try:
        msg = message(body, queue, attempt, err or None)
    except (orjson.JSONDecodeError, MessageDecodeError):
        # keep what the job's fields say, so a dead letter shows why it died
        raw = body
        msg = Message(
            id=id_.decode(),
            kind="task",
            name="?",
            queue=queue,
            attempt=attempt,
            errors=[ErrorRecord.from_dict(e) for e in orjson.loads(err)] if err else [],
        )
    state = State(st.decode())
    if state is State.SCHEDULED and attempt > 0:
        state = State.RETRYING
    return JobInfo(
        message=msg,
        state=state,
        run_at=_opt_float(ra),
        updated_at=_opt_float(u),
        worker=w.decode() if w else None,
        lease_until=_opt_float(lu),
        result=res or None,
        replays=int(rp or 0),
        raw=raw,
    )
