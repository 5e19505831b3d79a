"""What each part of the one-job insert costs the server, in alternated rounds.

Issue 25.1 on PostgreSQL: ``queries.enqueue_one`` is one statement (the row,
``ON CONFLICT DO NOTHING``, the count trigger's delta row, the NOTIFY).  Each
variant below is that statement with one part taken away, sent on one held
autocommitted psycopg connection (prepared), ``-n`` times a round; per call
it reports the server process's CPU (/proc/PID/schedstat), the WAL it moved
(pg_current_wal_insert_lsn, the whole cluster: run it when nothing else
writes) and the wall time.

    current      queries.enqueue_one as the broker sends it
    conflict_id  ``ON CONFLICT (id) DO NOTHING``: the primary key is the only
                 arbiter (the unique key's partial index is not probed)
    plain        no ON CONFLICT: a plain insert (no speculative insertion)
    no_notify    without the NOTIFY
    no_trigger   the same statement on a copy of the schema whose insert
                 count trigger is dropped

    flock /tmp/dw-bench.lock python benchmarks/postgres_enqueue_parts.py \\
        [--db pg251] [-n 2000] [--rounds 5] [--only current,plain,...]

Schemas ``dw_parts`` and ``dw_parts_nt`` are made (migrated), used and dropped.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.queries import Queries

S, S_NT = "dw_parts", "dw_parts_nt"


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="pg251")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="current,conflict_id,plain,no_notify,no_trigger")
    a = p.parse_args()
    dsn = f"postgresql://postgres@127.0.0.1:5432/{a.db}"
    for s in (S, S_NT):
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        PostgresBroker(f"{dsn}?schema={s}").migrate()
    mon = psycopg.connect(dsn, autocommit=True)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"DROP TRIGGER dw_jobs_count_insert ON {S_NT}.dw_jobs")
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])
    q, q_nt = Queries(S), Queries(S_NT)
    one = q.enqueue_one
    notify = b", (SELECT count(pg_notify("
    stmts = {
        "current": one,
        "conflict_id": one.replace(b"ON CONFLICT DO NOTHING", b"ON CONFLICT (id) DO NOTHING"),
        "plain": one.replace(b" ON CONFLICT DO NOTHING", b""),
        "no_notify": one[: one.index(notify)] if notify in one else one,
        "no_trigger": q_nt.enqueue_one,
    }
    names = a.only.split(",")

    def params() -> dict[str, Any]:
        job = uuid.uuid4()
        body = (
            b'{"id":"' + str(job).encode() + b'","kind":"task","name":"noop","queue":"default",'
            b'"args":[1],"kwargs":{},"created_at":1764972000.123,"max_attempts":3,'
            b'"headers":{},"priority":0}'
        )
        return {
            "id": str(job),
            "queue": "default",
            "name": "noop",
            "kind": "task",
            "eta": None,
            "priority": 0,
            "max_attempts": 3,
            "key": None,
            "msg_key": None,
            "body": body,
            "channel": q.channel,
        }

    for name in names:  # warm: plans prepared, pages in memory
        for _ in range(50):
            conn.execute(stmts[name], params(), prepare=True).fetchall()

    def lsn() -> int:
        r = mon.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert r is not None
        return int(r[0])

    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in names}
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            stmt = stmts[name]
            ps = [params() for _ in range(a.n)]
            l0, c0, t0 = lsn(), cpu_ns(pid), time.perf_counter()
            for pr in ps:
                conn.execute(stmt, pr, prepare=True).fetchall()
            wall = time.perf_counter() - t0
            got[name].append(((cpu_ns(pid) - c0) / a.n / 1e3, (lsn() - l0) / a.n, a.n / wall))
    print("| variant | server CPU µs/call | WAL B/call | calls/s | ÷ current (calls/s) |")
    print("|---|--:|--:|--:|--:|")
    base = [x[2] for x in got.get("current", [])]
    for name in names:
        cpu = statistics.median(x[0] for x in got[name])
        wal = statistics.median(x[1] for x in got[name])
        rate = statistics.median(x[2] for x in got[name])
        rel = (
            statistics.median(x[2] / b for x, b in zip(got[name], base, strict=True))
            if base
            else float("nan")
        )
        print(f"| {name} | {cpu:.1f} | {wal:.0f} | {rate:,.0f} | {rel:.3f} |")
    conn.close()
    for s in (S, S_NT):
        mon.execute(f"DROP SCHEMA {s} CASCADE")
    mon.close()


if __name__ == "__main__":
    main()
