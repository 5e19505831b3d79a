"""What each part of the one-job insert costs the server, in alternated rounds.

Issue 25.1 on PostgreSQL: ``queries.enqueue_one`` is one statement (the row,
``ON CONFLICT DO NOTHING``, the count trigger's delta row, the NOTIFY).  Each
variant below is that statement with one part taken away or changed, sent on
one held autocommitted psycopg connection (prepared), ``-n`` times a round;
per call it reports the server process's CPU (/proc/PID/schedstat: run it as
a user that may read it), the WAL it moved (pg_current_wal_insert_lsn, the
whole cluster: run it when nothing else writes), this thread's CPU and the
calls per second, and the median of each round's rate over ``current``'s.

    current      queries.enqueue_one as the broker sent it (a dict of 11
                 named parameters, two CASEs on the eta)
    ready        queries.enqueue_ready: the same row, positional parameters,
                 the columns' defaults for state and times
    conflict_id  current with ``ON CONFLICT (id) DO NOTHING``: the primary
                 key the only arbiter
    plain        current without ON CONFLICT (no speculative insertion)
    no_notify    current without the NOTIFY
    no_trigger   current on a copy of the schema without the insert count
                 trigger (migration 0004)
    trigger_empty  ... whose insert trigger keeps its transition table and
                 does nothing (what firing it costs, without the delta row)
    trigger_row  ... whose insert trigger is a row trigger writing one delta
                 row per job (no transition table, no GROUP BY)

    flock /tmp/dw-bench.lock python benchmarks/postgres_enqueue_parts.py \\
        [--db pg251] [-n 2000] [--rounds 5] [--only current,ready,...]

A schema per variant (``dw_parts_*``) is made (migrated), used and dropped.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.queries import Queries

ALL = "current,ready,conflict_id,plain,no_notify,no_trigger,trigger_empty,trigger_row"
RETRYING = "CASE WHEN {t}state = 'scheduled' AND {t}attempt > 0 THEN 'retrying' ELSE {t}state END"


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def schema_of(name: str) -> str:
    return "dw_parts_" + name


def alter(c: psycopg.Connection[Any], name: str, s: str) -> None:
    """The schema's insert trigger as the variant has it."""
    drop = f"DROP TRIGGER dw_jobs_count_insert ON {s}.dw_jobs"
    if name == "no_trigger":
        c.execute(drop.encode())
    elif name == "trigger_empty":
        c.execute(
            f"CREATE OR REPLACE FUNCTION {s}.dw_count_inserted() RETURNS trigger"
            " LANGUAGE plpgsql AS $f$ BEGIN RETURN NULL; END $f$".encode()
        )
    elif name == "trigger_row":
        c.execute(drop.encode())
        c.execute(
            f"CREATE FUNCTION {s}.dw_count_row() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
            f" INSERT INTO {s}.dw_count_deltas (queue, state, n)"
            f" VALUES (NEW.queue, {RETRYING.format(t='NEW.')}, 1); RETURN NULL; END $f$".encode()
        )
        c.execute(
            f"CREATE TRIGGER dw_jobs_count_row AFTER INSERT ON {s}.dw_jobs"
            f" FOR EACH ROW EXECUTE FUNCTION {s}.dw_count_row()".encode()
        )


def statement(name: str, q: Queries) -> bytes:
    one = q.enqueue_one
    notify = b", (SELECT count(pg_notify("
    if name == "ready":
        return q.enqueue_ready
    if name == "conflict_id":
        return one.replace(b"ON CONFLICT DO NOTHING", b"ON CONFLICT (id) DO NOTHING")
    if name == "plain":
        return one.replace(b" ON CONFLICT DO NOTHING", b"")
    if name == "no_notify":
        return one[: one.index(notify)]
    return one


def params(name: str, q: Queries) -> Any:
    job = uuid.uuid4()
    body = (
        b'{"id":"' + str(job).encode() + b'","kind":"task","name":"noop","queue":"default",'
        b'"args":[1],"kwargs":{},"created_at":1764972000.123,"max_attempts":3,'
        b'"headers":{},"priority":0}'
    )
    if name == "ready":
        return (str(job), "default", "noop", "task", 0, 3, None, None, body, q.channel)
    return enqueue_params(q, job, body)


def enqueue_params(q: Queries, job: uuid.UUID, body: bytes) -> dict[str, Any]:
    """The named parameters of ``queries.enqueue`` for one ready no-op job
    (``postgres_server_work.py`` measures the server's side of the same)."""
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="pg251")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default=ALL)
    a = p.parse_args()
    dsn = f"postgresql://postgres@127.0.0.1:5432/{a.db}"
    names = a.only.split(",")
    mon = psycopg.connect(dsn, autocommit=True)
    conn = psycopg.connect(dsn, autocommit=True)
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])
    runs: dict[str, Callable[[list[Any]], None]] = {}
    for name in names:
        s = schema_of(name)
        mon.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
        PostgresBroker(f"{dsn}?schema={s}").migrate()
        alter(mon, name, s)
        q = Queries(s)
        stmt = statement(name, q)

        def run(ps: list[Any], stmt: bytes = stmt) -> None:
            for pr in ps:
                conn.execute(stmt, pr, prepare=True).fetchall()

        runs[name] = run
        run([params(name, q) for _ in range(50)])  # warm: plans prepared, pages in memory

    def lsn() -> int:
        r = mon.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert r is not None
        return int(r[0])

    got: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in names}
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            q = Queries(schema_of(name))
            ps = [params(name, q) for _ in range(a.n)]
            l0, c0, t0, w0 = lsn(), cpu_ns(pid), time.thread_time(), time.perf_counter()
            runs[name](ps)
            wall = time.perf_counter() - w0
            client = (time.thread_time() - t0) / a.n * 1e6
            got[name].append(
                ((cpu_ns(pid) - c0) / a.n / 1e3, (lsn() - l0) / a.n, client, a.n / wall)
            )
    print(
        "| variant | server CPU µs/call | WAL B/call | client CPU µs/call | calls/s | ÷ current |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    base = [x[3] for x in got.get("current", [])]
    for name in names:
        cpu, wal, client, rate = (statistics.median(x[i] for x in got[name]) for i in range(4))
        rel = (
            statistics.median(x[3] / b for x, b in zip(got[name], base, strict=True))
            if base
            else float("nan")
        )
        print(f"| {name} | {cpu:.1f} | {wal:.0f} | {client:.1f} | {rate:,.0f} | {rel:.3f} |")
    conn.close()
    for name in names:
        mon.execute(f"DROP SCHEMA {schema_of(name)} CASCADE".encode())
    mon.close()


if __name__ == "__main__":
    main()
