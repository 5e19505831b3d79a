"""The PostgreSQL producer next to bare psycopg, in one process, in alternated rounds.

Issue 25.1 and 25.4 ask for ratios to the bare client measured in the same
run.  Each round runs every variant once (the order reversed every other
round, so none always runs first), and the figures are the medians over the
rounds of each variant's rate and of its ratio to the anchor of the same
round:

    anchor   the harness' own bare figure (peers/limits.py ``python_pg``): a
             one-column table, ``INSERT`` then ``COMMIT`` one row at a time
             (psycopg's default transaction: BEGIN, INSERT, COMMIT)
    floor    the least a job queue's row needs, with bare psycopg: the same
             row into the same ``dw_jobs`` table (its indexes, its count
             trigger) and the same wake-up (``pg_notify`` of the queue), one
             autocommitted statement on one held connection
    enqueue  ``task.enqueue(i)``, what the harness' W1 times
    pgqueuer the peer, as the harness' adapter enqueues (asyncpg, one
             statement per job, awaited one at a time): a process of the
             peers venv (``--peers-python``, default /tmp/peers-venv) runs
             benchmarks/pgqueuer_enqueue.py, its tables installed by ``pgq
             install`` in a schema of their own; skipped when that venv is
             missing

(the one-at-a-time variants also print this thread's CPU time per call:
``time.thread_time``, which moves less than wall time on a shared machine;
pgqueuer's is its own process's thread, measured there)
    copy     bare psycopg ``COPY`` of ``--bulk`` rows of the same shape into
             ``dw_jobs`` (ids and JSON bodies made in the loop, one NOTIFY),
             one transaction
    bulk     ``task.enqueue_many(range(--bulk))`` (the harness' W2)

    PYTHONPATH=src flock /tmp/dw-bench.lock python benchmarks/postgres_producer.py \
        [--rounds 7] [-n 1000] [--bulk 20000] [--only anchor,floor,enqueue,pgqueuer]

A fresh schema is migrated, used and dropped.  ``--json`` prints the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg

import dumbwaiter as dw
from dumbwaiter.brokers.postgres import PostgresBroker

DSN = "postgresql://postgres@127.0.0.1:5432/test"
#: variants that make one call per job: their CPU per call is reported too
ONE_AT_A_TIME = ("anchor", "floor", "enqueue", "pgqueuer")
PEERS_PYTHON = "/tmp/peers-venv/bin/python"


async def noop(i: int) -> None:
    """The harness' task shape: one int argument."""


def variants(dsn: str, schema: str, n: int, bulk: int) -> dict[str, Callable[[], float]]:
    """Each variant: run once, return items per second."""
    s = f'"{schema}"'
    app = dw.App(f"{dsn}?schema={schema}")
    task = app.task(name="noop")(noop)
    broker = app.broker
    assert isinstance(broker, PostgresBroker)
    broker.open_sync()
    channel = f"dumbwaiter:{schema}"
    anchor_conn = psycopg.connect(dsn)
    # a table like the harness' (not TEMP: a temporary table's commit flushes no WAL)
    anchor_conn.execute(
        f"CREATE TABLE {s}.peers_limits (id bigserial PRIMARY KEY, payload text NOT NULL)"  # type: ignore[arg-type]
    )
    anchor_conn.commit()
    bare = psycopg.connect(dsn, autocommit=True)
    floor_sql = (
        f"WITH ins AS (INSERT INTO {s}.dw_jobs (id, queue, name, kind, max_attempts, msg_key, body)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING queue)"
        " SELECT pg_notify(%s, queue) FROM ins"
    ).encode()

    def body(i: int, job_id: uuid.UUID) -> bytes:
        return orjson.dumps(
            {
                "id": str(job_id),
                "kind": "task",
                "name": "noop",
                "queue": "default",
                "args": [i],
                "kwargs": {},
                "created_at": time.time(),
                "max_attempts": 3,
            }
        )

    anchor_sql = f"INSERT INTO {s}.peers_limits (payload) VALUES (%s)".encode()

    def anchor() -> float:
        t = time.perf_counter()
        for _ in range(n):
            anchor_conn.execute(anchor_sql, ("x" * 100,))
            anchor_conn.commit()
        return n / (time.perf_counter() - t)

    def floor() -> float:
        t = time.perf_counter()
        for i in range(n):
            job_id = uuid.uuid4()
            params = (job_id, "default", "noop", "task", 3, None, body(i, job_id), channel)
            bare.execute(floor_sql, params).fetchall()
        return n / (time.perf_counter() - t)

    def enqueue() -> float:
        t = time.perf_counter()
        for i in range(n):
            task.enqueue(i)
        return n / (time.perf_counter() - t)

    copy_sql = (
        f"COPY {s}.dw_jobs (id, queue, name, kind, priority, max_attempts, key, msg_key, body)"
        " FROM STDIN (FORMAT BINARY)"
    ).encode()
    copy_types = ["uuid", "text", "text", "text", "int4", "int4", "text", "text", "bytea"]

    def copy() -> float:
        t = time.perf_counter()
        with bare.transaction():
            with bare.cursor().copy(copy_sql) as cp:
                cp.set_types(copy_types)
                for i in range(bulk):
                    job_id = uuid.uuid4()
                    cp.write_row(
                        (job_id, "default", "noop", "task", 0, 3, None, None, body(i, job_id))
                    )
            bare.execute("SELECT pg_notify(%s, %s)", (channel, "default"))
        return bulk / (time.perf_counter() - t)

    def enqueue_many() -> float:
        t = time.perf_counter()
        task.enqueue_many(range(bulk))
        return bulk / (time.perf_counter() - t)

    return {
        "anchor": anchor,
        "floor": floor,
        "enqueue": enqueue,
        "copy": copy,
        "bulk": enqueue_many,
    }


@contextlib.contextmanager
def pgqueuer(dsn: str, schema: str, n: int, python: str) -> Iterator[Callable[[], float] | None]:
    """The peer's variant (see the module docstring), or None without its venv."""
    pgq = Path(python).with_name("pgq")
    if not pgq.exists():
        yield None
        return
    env = {**os.environ, "PGQUEUER_SCHEMA": schema}
    subprocess.run([pgq, "--pg-dsn", dsn, "install"], check=True, capture_output=True, env=env)
    script = Path(__file__).with_name("pgqueuer_enqueue.py")
    proc = subprocess.Popen(
        [python, str(script), dsn, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    last_cpu: list[float] = []

    def run() -> float:
        stdin.write("go\n")
        stdin.flush()
        got = json.loads(stdout.readline())
        last_cpu[:] = [got["cpu_us"]]
        return float(got["rate"])

    run.cpu_us = last_cpu  # type: ignore[attr-defined]
    try:
        yield run
    finally:
        stdin.write("quit\n")
        stdin.close()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default=DSN)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("-n", type=int, default=1000, help="one-at-a-time calls per variant and round")
    p.add_argument("--bulk", type=int, default=20000, help="rows per bulk call")
    p.add_argument("--only", default="", help="comma-separated variants")
    p.add_argument("--json", action="store_true")
    p.add_argument("--peers-python", default=PEERS_PYTHON, help="the peers venv's python")
    a = p.parse_args()
    schema = f"dw_prod_bench_{secrets.token_hex(3)}"
    PostgresBroker(f"{a.dsn}?schema={schema}").migrate()
    peer_schema = f"{schema}_pgq"
    only = a.only.split(",") if a.only else []
    try:
        with pgqueuer(
            a.dsn, peer_schema, a.n, a.peers_python if not only or "pgqueuer" in only else ""
        ) as peer:
            runs = variants(a.dsn, schema, a.n, a.bulk)
            if peer is not None:
                runs["pgqueuer"] = peer
            if only:
                runs = {k: v for k, v in runs.items() if k in only}
            for f in runs.values():  # warm up: connections, prepared statements
                f()
            rounds = measure(runs, a.dsn, schema, peer_schema, a.rounds, a.n)
        report(rounds, a.json)
    finally:
        with psycopg.connect(a.dsn, autocommit=True) as admin:
            for s in (schema, peer_schema):
                admin.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')  # type: ignore[arg-type]


def measure(
    runs: dict[str, Callable[[], float]],
    dsn: str,
    schema: str,
    peer_schema: str,
    rounds: int,
    n: int,
) -> list[dict[str, float]]:
    """Every variant once a round, the order reversed every other round;
    the tables emptied after each."""
    out: list[dict[str, float]] = []
    with psycopg.connect(dsn, autocommit=True) as admin:
        for r in range(rounds):
            order = list(runs.items()) if r % 2 == 0 else list(reversed(runs.items()))
            got = {}
            for name, f in order:
                cpu = time.thread_time()
                got[name] = f()
                if name == "pgqueuer":  # measured in its own process
                    got[f"{name}_cpu_us"] = f.cpu_us[0]  # type: ignore[attr-defined]
                    admin.execute(f'TRUNCATE "{peer_schema}".pgqueuer')  # type: ignore[arg-type]
                    continue
                if name in ONE_AT_A_TIME:  # this thread's CPU per call, microseconds
                    got[f"{name}_cpu_us"] = (time.thread_time() - cpu) / n * 1e6
                admin.execute(f'TRUNCATE "{schema}".dw_jobs, "{schema}".dw_count_deltas')  # type: ignore[arg-type]
            out.append(got)
    return out


def report(rounds: list[dict[str, float]], as_json: bool) -> None:
    names = list(rounds[0])
    med = {k: statistics.median(r[k] for r in rounds) for k in names}
    ratios: dict[str, float] = {}
    for k, base in (
        ("floor", "anchor"),
        ("enqueue", "anchor"),
        ("enqueue", "floor"),
        ("pgqueuer", "anchor"),
        ("enqueue", "pgqueuer"),
        ("bulk", "copy"),
    ):
        if k in names and base in names:
            ratios[f"{k}/{base}"] = statistics.median(r[k] / r[base] for r in rounds)
    if as_json:
        out: dict[str, Any] = {"rounds": rounds, "median": med, "ratios": ratios}
        print(json.dumps(out))
        return
    for k in names:
        if k.endswith("_cpu_us"):
            continue
        lo, hi = min(r[k] for r in rounds), max(r[k] for r in rounds)
        cpu = f"   this thread's CPU {med[k + '_cpu_us']:.0f} µs/call" if k in ONE_AT_A_TIME else ""
        print(f"{k:8s} {med[k]:10,.0f}/s  ({lo:,.0f}-{hi:,.0f}){cpu}")
    for k, v in ratios.items():
        print(f"{k:16s} {v:.2f}")


if __name__ == "__main__":
    main()
