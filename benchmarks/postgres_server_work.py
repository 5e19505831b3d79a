"""What the server does for one enqueue: ours, pgqueuer's, the bare INSERT.

Issue 25.1 on PostgreSQL: in the harness pgqueuer's one-at-a-time enqueue
ran ahead of ours while our client CPU per call was level with its, so the
difference is in what each call asks of the server.  Each variant below runs
``-n`` calls on fresh connections (after ``--warmup`` calls, so prepared
statements are in place) and reports, per call:

    turns      request/response turns on the wire (an in-process TCP proxy
               counts the client's sends that follow a server reply), and
               bytes each way: a separate pass through the proxy
    server µs  CPU time of the variant's server processes (their
               /proc/PID/schedstat, found by application_name)
    client µs  this process's (or pgqueuer's process's) thread CPU
    WAL B      pg_current_wal_insert_lsn() moved (the whole cluster: run it
               when nothing else writes)
    records, fpi, syncs
               pg_stat_wal deltas (records, full-page images, WAL syncs)
    commits    pg_stat_database.xact_commit delta
    rows       pg_stat_user_tables.n_tup_ins delta, per table

Counters read from pg_stat_* are flushed by a server process when it exits,
so those deltas span the variant's whole session (warm-up included) and are
divided by all its calls.

    anchor     the harness' bare figure (peers/limits.py ``python_pg``):
               a one-column table, INSERT then COMMIT, psycopg's default
               transaction
    enqueue    ``task.enqueue(i)`` (the harness adapter's call)
    aenqueue   ``await task.aenqueue(i)`` on one event loop
    pgqueuer   the harness adapter's ``Queries.enqueue(task, payload)`` on
               one asyncpg connection: a child process in the peers venv
               (``--peers-python``), which has asyncpg and pgqueuer

    flock /tmp/dw-bench.lock python benchmarks/postgres_server_work.py \\
        [--db pg251] [-n 3000] [--rounds 2] [--explain]

The database (``--db``) gets dumbwaiter's tables in schema ``dw_work``
(migrated, truncated) and pgqueuer's in ``pgq_work`` (``pgq install``,
truncated).  ``--explain`` also prints ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of
each enqueue statement once.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOST, PORT = "127.0.0.1", 5432
PEERS_PYTHON = "/tmp/peers-venv/bin/python"
SCHEMA, PGQ_SCHEMA = "dw_work", "pgq_work"


class Proxy:
    """A TCP proxy to the server that counts request/response turns: a turn
    is a run of client data that follows server data (or starts the
    connection).  Runs its own event loop in a thread."""

    def __init__(self) -> None:
        self.turns = 0
        self.up = 0
        self.down = 0
        self._ready = threading.Event()
        self.port = 0
        threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True).start()
        self._ready.wait()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(HOST, PORT)
        sock = cw.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sw.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        last = ["server"]

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, side: str) -> None:
            try:
                while data := await r.read(65536):
                    if side == "client":
                        self.up += len(data)
                        if last[0] == "server":
                            self.turns += 1
                    else:
                        self.down += len(data)
                    last[0] = side
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        await asyncio.gather(pump(cr, sw, "client"), pump(sr, cw, "server"))


def server_cpu_ns(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except OSError:
            pass
    return total


def dsn(db: str, port: int, app: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}?application_name={app}"


class Monitor:
    """Reads the server's counters on a connection of its own."""

    def __init__(self, db: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn(db, PORT, "work-monitor"), autocommit=True)

    def pids(self, app: str) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def counters(self) -> dict[str, float]:
        c = self.conn
        c.execute("SELECT pg_stat_clear_snapshot()")
        out: dict[str, float] = {}
        wal = c.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync FROM pg_stat_wal"
        ).fetchone()
        assert wal is not None
        for k, v in zip(("records", "fpi", "wal_bytes", "writes", "syncs"), wal, strict=True):
            out[k] = float(v)
        db = c.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        assert db is not None
        out["commits"], out["rollbacks"] = float(db[0]), float(db[1])
        for rel, ins in c.execute(
            "SELECT schemaname || '.' || relname, n_tup_ins FROM pg_stat_user_tables"
        ).fetchall():
            out[f"ins {rel}"] = float(ins)
        return out


def pgq_child(dsn_: str, schema: str, n: int, warmup: int, explain: bool) -> None:
    """Run in the peers venv: pgqueuer's enqueue as the harness adapter makes it."""

    async def serve() -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn_, server_settings={"search_path": schema})
        q = Queries(AsyncpgDriver(conn))
        if explain:
            sql = q.qbq.build_enqueue_query("raise")
            for _ in range(20):  # warm: the last one is printed
                rows = await conn.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS, WAL, VERBOSE) " + sql,
                    [0],
                    ["noop"],
                    [b"1"],
                    [datetime.timedelta(0)],
                    [None],
                    ["null"],
                )
            print(json.dumps({"explain": [r[0] for r in rows]}), flush=True)
            await conn.close()
            return
        for i in range(warmup):
            await q.enqueue("noop", str(i).encode())
        print(json.dumps({"pid": conn.get_server_pid()}), flush=True)
        sys.stdin.readline()
        cpu, t = time.thread_time(), time.perf_counter()
        for i in range(n):
            await q.enqueue("noop", str(i).encode())
        wall = time.perf_counter() - t
        cpu_us = (time.thread_time() - cpu) / n * 1e6
        print(json.dumps({"wall": wall, "cpu_us": cpu_us}), flush=True)
        sys.stdin.readline()
        await conn.close()

    asyncio.run(serve())  # the harness' producer runs on asyncio's own loop


async def noop(i: int) -> None:
    """The harness' task shape: one int argument."""


def run_ours(
    name: str,
    url: str,
    n: int,
    warmup: int,
    timed: Callable[[Callable[[], None]], None],
    res: dict[str, float],
    mon: Monitor,
    app_name: str,
) -> None:
    """``task.enqueue`` (sync, timed by ``timed``) or ``await task.aenqueue``."""
    import dumbwaiter as dw
    from dumbwaiter.brokers.postgres import PostgresBroker

    app = dw.App(f"{url}&schema={SCHEMA}")
    task = app.task(name="noop")(noop)
    broker = app.broker
    assert isinstance(broker, PostgresBroker)
    if name == "enqueue":
        broker.open_sync()
        for i in range(warmup):
            task.enqueue(i)

        def enqueue() -> None:
            for i in range(n):
                task.enqueue(i)

        timed(enqueue)
        app.close()
    else:

        async def go() -> None:
            for i in range(warmup):
                await task.aenqueue(i)

            async def many() -> None:
                for i in range(n):
                    await task.aenqueue(i)

            # timed() blocks: the loop's part is timed here the same way
            pids = mon.pids(app_name)
            lsn0, s0 = mon.lsn(), server_cpu_ns(pids)
            cpu, t = time.thread_time(), time.perf_counter()
            await many()
            res["wall"] = time.perf_counter() - t
            res["client_us"] = (time.thread_time() - cpu) / n * 1e6
            res["server_us"] = (server_cpu_ns(pids) - s0) / n / 1e3
            res["wal_lsn"] = (mon.lsn() - lsn0) / n
            res["pids"] = len(pids)
            await app.aclose()

        asyncio.run(go())


def run_variant(
    name: str, db: str, port: int, n: int, warmup: int, mon: Monitor, peers_python: str
) -> dict[str, float]:
    """One pass of a variant on port (the server, or the proxy); returns the
    loop's wall and client CPU, the server processes' CPU, the WAL moved."""
    app_name = f"work-{name}"
    url = dsn(db, port, app_name)
    res: dict[str, float] = {}

    def timed(loop: Callable[[], None]) -> None:
        pids = mon.pids(app_name)
        lsn0, s0 = mon.lsn(), server_cpu_ns(pids)
        cpu, t = time.thread_time(), time.perf_counter()
        loop()
        res["wall"] = time.perf_counter() - t
        res["client_us"] = (time.thread_time() - cpu) / n * 1e6
        res["server_us"] = (server_cpu_ns(pids) - s0) / n / 1e3
        res["wal_lsn"] = (mon.lsn() - lsn0) / n
        res["pids"] = len(pids)

    if name == "anchor":
        import psycopg

        with psycopg.connect(url) as conn:
            sql = b"INSERT INTO public.peers_limits (payload) VALUES (%s)"

            def anchor() -> None:
                for _ in range(n):
                    conn.execute(sql, ("x" * 100,))
                    conn.commit()

            for _ in range(warmup):
                conn.execute(sql, ("x" * 100,))
                conn.commit()
            timed(anchor)
    elif name in ("enqueue", "aenqueue"):
        run_ours(name, url, n, warmup, timed, res, mon, app_name)
    elif name == "pgqueuer":
        script = Path(__file__).resolve()
        proc = subprocess.Popen(
            [peers_python, str(script), "--pgq-child", url, "-n", str(n), "--warmup", str(warmup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        pid = json.loads(proc.stdout.readline())["pid"]
        lsn0, s0 = mon.lsn(), server_cpu_ns([pid])
        proc.stdin.write("go\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        res["wall"] = got["wall"]
        res["client_us"] = got["cpu_us"]
        res["server_us"] = (server_cpu_ns([pid]) - s0) / n / 1e3
        res["wal_lsn"] = (mon.lsn() - lsn0) / n
        res["pids"] = 1
        proc.stdin.write("end\n")
        proc.stdin.close()
        proc.wait(30)
    res["rate"] = n / res["wall"]
    return res


def prepare(db: str, peers_python: str) -> None:
    import psycopg

    from dumbwaiter.brokers.postgres import PostgresBroker

    with psycopg.connect(dsn(db, PORT, "work-setup"), autocommit=True) as c:
        c.execute(
            "CREATE TABLE IF NOT EXISTS public.peers_limits"
            " (id bigserial PRIMARY KEY, payload text NOT NULL)"
        )
        c.execute(f"CREATE SCHEMA IF NOT EXISTS {PGQ_SCHEMA}")
    PostgresBroker(f"{dsn(db, PORT, 'work-setup')}&schema={SCHEMA}").migrate()
    pgq = Path(peers_python).with_name("pgq")
    have = False
    with psycopg.connect(dsn(db, PORT, "work-setup"), autocommit=True) as c:
        row = c.execute(f"SELECT to_regclass('{PGQ_SCHEMA}.pgqueuer') IS NOT NULL").fetchone()
        have = bool(row and row[0])
    if not have:
        env = {**os.environ, "PGQUEUER_SCHEMA": PGQ_SCHEMA}
        subprocess.run(
            [pgq, "--pg-dsn", dsn(db, PORT, "work-setup"), "install"],
            check=True,
            capture_output=True,
            env=env,
        )
    with psycopg.connect(dsn(db, PORT, "work-setup"), autocommit=True) as c:
        c.execute(
            f"TRUNCATE {SCHEMA}.dw_jobs, {SCHEMA}.dw_queues, {SCHEMA}.dw_waiters,"
            f" {SCHEMA}.dw_count_deltas, {SCHEMA}.dw_counts, public.peers_limits,"
            f" {PGQ_SCHEMA}.pgqueuer, {PGQ_SCHEMA}.pgqueuer_log"
        )
        c.execute("CHECKPOINT")  # full-page images now, not during the passes


def explain(db: str, peers_python: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one enqueue statement of each."""
    import uuid

    import psycopg

    from dumbwaiter.brokers.postgres.queries import Queries

    q = Queries(SCHEMA)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.postgres_enqueue_parts import enqueue_params

    def params() -> dict[str, Any]:
        job = uuid.uuid4()
        return enqueue_params(q, job, b'{"id":"' + str(job).encode() + b'","args":[1],"kwargs":{}}')

    with psycopg.connect(dsn(db, PORT, "work-explain"), autocommit=True) as c:
        for _ in range(20):  # warm: the last one is printed
            rows = c.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, WAL, VERBOSE) " + q.enqueue_one, params()
            ).fetchall()
        print("=== ours: queries.enqueue_one")
        print("\n".join(r[0] for r in rows))
    out = subprocess.run(
        [
            peers_python,
            str(Path(__file__).resolve()),
            "--pgq-child",
            dsn(db, PORT, "work-explain"),
            "--explain",
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        sys.exit(out.stderr)
    print("=== pgqueuer: Queries.enqueue")
    print("\n".join(json.loads(out.stdout)["explain"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="pg251")
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="anchor,enqueue,aenqueue,pgqueuer")
    p.add_argument("--peers-python", default=PEERS_PYTHON)
    p.add_argument("--explain", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--pgq-child", metavar="DSN")
    a = p.parse_args()
    if a.pgq_child:
        pgq_child(a.pgq_child, PGQ_SCHEMA, a.n, a.warmup, a.explain)
        return
    prepare(a.db, a.peers_python)
    if a.explain:
        explain(a.db, a.peers_python)
        return
    names = a.only.split(",")
    mon = Monitor(a.db)
    proxy = Proxy()
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(a.rounds):
        got: dict[str, dict[str, float]] = {}
        for name in names if r % 2 == 0 else names[::-1]:
            c0 = mon.counters()
            res = run_variant(name, a.db, PORT, a.n, a.warmup, mon, a.peers_python)
            time.sleep(0.5)  # the variant's server process flushes its counters as it exits
            c1 = mon.counters()
            calls = a.n + a.warmup
            for k in c1:
                d = (c1[k] - c0.get(k, 0.0)) / calls
                if d and (not k.startswith("ins ") or d > 0.01):
                    res[k] = d
            t0, u0, d0 = proxy.turns, proxy.up, proxy.down
            run_variant(name, a.db, proxy.port, a.n, a.warmup, mon, a.peers_python)
            res["turns"] = (proxy.turns - t0) / calls
            res["bytes_up"] = (proxy.up - u0) / calls
            res["bytes_down"] = (proxy.down - d0) / calls
            got[name] = res
        rounds.append(got)
        for name in names:
            res = got[name]
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in res.items()))
    if a.json:
        print(json.dumps(rounds))
    print("medians:")
    for name in names:
        keys = sorted({k for rd in rounds for k in rd[name]})
        med = {k: statistics.median(rd[name].get(k, 0.0) for rd in rounds) for k in keys}
        print(f"  {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in med.items()))


if __name__ == "__main__":
    main()
