"""The SQLite broker's worker side: fetch, ack, retry, dead, extend, rescue.

A claim is one ``UPDATE ... RETURNING`` per queue over the ready index, in
one ``BEGIN IMMEDIATE`` transaction that first promotes due scheduled jobs;
no job is handed to two workers while its lease holds (each lease carries a
fencing token that every later change of that job must present).  An idle
fetch watches the WAL file (wake.py) and claims again when another process
commits.  ``rescue`` gives back the jobs of expired leases and prunes
finished jobs, expired keys and old events.

The claim and the ack count what they moved in ``dw_counts`` themselves,
once per batch and queue, in their own transaction (schema.sql: the trigger
that counts every other change skips those two).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import LeaseExpired
from ...message import ErrorRecord
from ..finished import compacts
from ..sql.rows import delivery_row, err_json, stored_message
from ..types import DeadLetter, Delivery, Rescued
from .connection import SQLiteConnection

_LEASE_EXPIRED = f"dumbwaiter.errors.{LeaseExpired.__name__}"


#: rows per ack statement (6 parameters each, under SQLite's 32,766 limit)
_ACK_CHUNK = 2000


@functools.lru_cache(maxsize=64)
def _ack_sql(n: int) -> str:
    """The ack of ``n`` jobs: one ``UPDATE ... FROM (VALUES ...)`` whose
    ``RETURNING`` names the queue of each job it finished, for the counters
    (the trigger skips running -> succeeded; executemany could not say which
    queues its rows were in).  A task without ``keep_result`` keeps a compact
    record (finished.py): its body shrinks to its task name, its error history
    goes.  One text per batch size, which the connection's statement cache
    keeps compiled."""
    values = ",".join(["(?,?,?,?,?,?)"] * n)
    return (
        "UPDATE dw_jobs SET state='succeeded', updated_at=v.column1, result=v.column2,"
        " expires_at=v.column3, lease_until=NULL, token=NULL,"
        ' body=CASE WHEN v.column4 THEN CAST(\'{"c":1,"name":\' || json_quote(name)'
        " || ',\"key\":' || json_quote(msg_key) || '}' AS BLOB)"
        " ELSE body END,"
        " errors=CASE WHEN v.column4 THEN NULL ELSE errors END,"
        " last_error_type=CASE WHEN v.column4 THEN NULL ELSE last_error_type END"
        f" FROM (VALUES {values}) AS v"
        " WHERE dw_jobs.id=v.column5 AND dw_jobs.token=v.column6 AND dw_jobs.state='running'"
        " RETURNING queue"
    )


#: a claim or an ack of n jobs of one queue moves n from one counter to the
#: other (their two transitions are not counted by the trigger: schema.sql)
_MOVE_COUNT = (
    "INSERT INTO dw_counts (queue, state, n) VALUES (?1, ?2, -?4), (?1, ?3, ?4)"
    " ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n"
)


class SQLiteTransport(SQLiteConnection):
    """The worker's calls: fetch and the outcomes of its jobs."""

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0:
            return []
        args = (list(queues), limit, lease, worker)
        out, next_due = await self._claim_safely(*args)
        if out or wait <= 0:
            return out
        # Nothing ready: watch the WAL, check once more (a commit may have
        # landed before the watch), then sleep until a write or the next eta.
        deadline = time.monotonic() + wait
        waker = self._wakers.get()
        while True:
            waker.arm()
            out, next_due = await self._claim_safely(*args)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            if next_due is not None:
                remaining = min(remaining, max(0.0, next_due - time.time()))
            await waker.wait(remaining)

    async def _claim_safely(
        self, queues: list[str], limit: int, lease: float, worker: str
    ) -> tuple[list[Delivery], float | None]:
        """A claim that can be cancelled: if the caller gives up while the claim
        runs on the broker thread, what it claimed is given back (uncharged)."""
        if self._executor is None:
            await self.open()
        assert self._executor is not None
        executor = self._executor
        fut = asyncio.get_running_loop().run_in_executor(
            executor, self._claim, queues, limit, lease, worker
        )
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:

            def give_back(f: asyncio.Future[tuple[list[Delivery], float | None]]) -> None:
                if f.cancelled() or f.exception() is not None or not f.result()[0]:
                    return
                with contextlib.suppress(RuntimeError):  # the broker was closed meanwhile
                    executor.submit(self._requeue, f.result()[0])

            fut.add_done_callback(give_back)
            raise

    def _claim(
        self, queues: list[str], limit: int, lease: float, worker: str
    ) -> tuple[list[Delivery], float | None]:
        def run(c: sqlite3.Connection) -> tuple[list[Delivery], float | None]:
            now = time.time()
            c.execute(
                "UPDATE dw_jobs SET state='ready' WHERE state='scheduled' AND run_at<=?", (now,)
            )
            paused = {r[0] for r in c.execute("SELECT name FROM dw_queues WHERE paused=1")}
            token = secrets.randbits(62)
            until = now + lease
            rows: list[Any] = []
            for q in queues:
                if q in paused:
                    continue
                got = c.execute(
                    "UPDATE dw_jobs SET state='running', attempt=attempt+1, token=?,"
                    " lease_until=?, worker=?, updated_at=? WHERE rowid IN (SELECT rowid"
                    " FROM dw_jobs WHERE state='ready' AND queue=?"
                    " ORDER BY priority DESC, run_at LIMIT ?)"
                    " RETURNING id, queue, attempt, body, errors, priority, run_at",
                    (token, until, worker, now, q, limit - len(rows)),
                ).fetchall()
                if got:  # counted here, not by the trigger: every row is of queue q
                    c.execute(_MOVE_COUNT, (q, "ready", "running", len(got)))
                    rows += got
                if len(rows) >= limit:
                    break
            next_due = None
            if not rows:
                r = c.execute("SELECT min(run_at) FROM dw_jobs WHERE state='scheduled'").fetchone()
                next_due = r[0]
            rows.sort(key=lambda r: (-r[5], r[6]))
            return [delivery_row(r, token, until) for r in rows], next_due

        return self._claim_tx(run)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._ack, ds)

    def _ack(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        params = [
            v
            for d in ds
            for v in (
                now,
                d.result,
                now + max(self.retention, d.result_ttl or 0.0),
                compacts(d),
                d.id,
                d.token,
            )
        ]

        def run(c: sqlite3.Connection) -> None:
            # counted here, per queue, from the rows the ack did finish (a lost
            # lease finishes none), not by the trigger
            done: Counter[str] = Counter()
            for start in range(0, len(ds), _ACK_CHUNK):
                chunk = params[start * 6 : (start + _ACK_CHUNK) * 6]
                done.update(q for (q,) in c.execute(_ack_sql(len(chunk) // 6), chunk).fetchall())
            for q, n in done.items():
                c.execute(_MOVE_COUNT, (q, "running", "succeeded", n))

        self._wtx(run)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._retry, ds)

    def _retry(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [
            (
                "scheduled" if d.retry_at > now else "ready",
                max(d.retry_at, now),
                err_json(d),
                _err_type(d),
                now,
                d.id,
                d.token,
            )
            for d in ds
        ]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state=?, run_at=?,"
                " errors=CASE WHEN ?3 IS NULL THEN errors"
                " ELSE json_insert(coalesce(errors, '[]'), '$[#]', json(?3)) END,"
                " last_error_type=coalesce(?4, last_error_type), updated_at=?,"
                " lease_until=NULL, token=NULL WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._dead, ds)

    def _dead(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [(err_json(d), _err_type(d), now, d.id, d.token) for d in ds]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state='dead',"
                " errors=CASE WHEN ?1 IS NULL THEN errors"
                " ELSE json_insert(coalesce(errors, '[]'), '$[#]', json(?1)) END,"
                " last_error_type=coalesce(?2, last_error_type), updated_at=?,"
                " lease_until=NULL, token=NULL WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._requeue, ds)

    def _requeue(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [
            ("scheduled" if d.retry_at > now else "ready", max(d.retry_at, now), now, d.id, d.token)
            for d in ds
        ]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state=?, attempt=max(attempt-1, 0), run_at=?,"
                " updated_at=?, lease_until=NULL, token=NULL"
                " WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        return await self._run(self._extend, ds, lease)

    def _extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        def run(c: sqlite3.Connection) -> list[Delivery]:
            until = time.time() + lease
            lost = []
            for d in ds:
                cur = c.execute(
                    "UPDATE dw_jobs SET lease_until=? WHERE id=? AND token=? AND state='running'",
                    (until, d.id, d.token),
                )
                if cur.rowcount == 1:
                    d.lease_until = until
                else:
                    lost.append(d)
            return lost

        return self._wtx(run)

    async def rescue(self) -> Rescued:
        return await self._run(self._rescue)

    def _rescue(self) -> Rescued:
        now = time.time()
        conn = self._worker_conn()
        # cheap read first: most calls find nothing and need no write lock
        expired = conn.execute(
            "SELECT 1 FROM dw_jobs WHERE state='running' AND lease_until<? LIMIT 1", (now,)
        ).fetchone()
        prunable = conn.execute(
            "SELECT 1 FROM dw_jobs WHERE expires_at<? UNION ALL"
            " SELECT 1 FROM dw_kv WHERE expires<? UNION ALL"
            " SELECT 1 FROM dw_events WHERE published_at<? LIMIT 1",
            (now, now, now - self.event_retention),
        ).fetchone()
        if not expired and not prunable:
            return Rescued()

        def run(c: sqlite3.Connection) -> Rescued:
            rows = c.execute(
                "SELECT id, attempt, max_attempts, coalesce(worker, ''), queue, name FROM dw_jobs"
                " WHERE state='running' AND lease_until<?",
                (now,),
            ).fetchall()
            dead: list[DeadLetter] = []
            for id_, attempt, max_attempts, worker, queue, name in rows:
                rec = ErrorRecord(
                    time=now,
                    type=_LEASE_EXPIRED,
                    message=f"lease expired: worker {worker or '?'} stopped heartbeating"
                    f" during attempt {attempt}",
                    worker=worker,
                    attempt=attempt,
                )
                err = orjson.dumps(rec.to_dict()).decode()
                buried = attempt >= max_attempts
                # a buried job's envelope goes with its report (on_dead hooks
                # log its arguments); only those rare rows return their body
                got = c.execute(
                    "UPDATE dw_jobs SET state=?, run_at=?, updated_at=?, lease_until=NULL,"
                    " token=NULL, errors=json_insert(coalesce(errors,'[]'),'$[#]',json(?)),"
                    " last_error_type=? WHERE id=? AND state='running'"
                    " RETURNING CASE WHEN state='dead' THEN body END, errors",
                    (
                        "dead" if buried else "ready",
                        now,
                        now,
                        err,
                        _LEASE_EXPIRED,
                        id_,
                    ),
                ).fetchall()  # run to its end: no statement left open in the transaction
                if buried and got:
                    [(body, errors)] = got
                    dead.append(
                        DeadLetter(
                            id_, queue, name, rec, stored_message(body, queue, attempt, errors)
                        )
                    )
            c.execute(
                "DELETE FROM dw_jobs WHERE rowid IN (SELECT rowid FROM dw_jobs"
                " WHERE expires_at<? LIMIT 5000)",
                (now,),
            )
            c.execute("DELETE FROM dw_kv WHERE expires<?", (now,))
            c.execute("DELETE FROM dw_events WHERE published_at<?", (now - self.event_retention,))
            return Rescued(len(rows), dead)

        return self._tx(conn, run)


def _err_type(d: Delivery) -> str | None:
    return None if d.error is None else d.error.type
