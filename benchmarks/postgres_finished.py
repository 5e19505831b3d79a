"""Drain speed of the PostgreSQL broker with 1,000,000 finished jobs kept, vs none.

Finished jobs stay in ``dw_jobs`` for the retention window (an hour by
default), so a busy system keeps a large table.  The claim reads only the
partial index of ready rows, so a worker should drain as fast next to a
million finished rows as next to none.  This measures it:

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/postgres_finished.py [--rows 1000000]
        [--jobs 20000] [--reps 3] [--dsn postgresql://postgres@127.0.0.1:5432/bench]

Two schemas in the benchmark database: ``dw_finished_empty`` (no finished
rows) and ``dw_finished_full`` (``--rows`` succeeded rows with realistic
UUIDv7 ids from the past day, bodies of the usual size, an expiry a day
ahead, then VACUUM ANALYZE as autovacuum would do).  Each repetition bulk-
enqueues ``--jobs`` no-op jobs into one schema, starts one
``dumbwaiter worker`` process (default concurrency) and measures, like the
peers harness' W1, jobs ÷ (last job end - first job start) from the times
the task bodies append to a file; then the other schema, alternating which
goes first.  It prints each run and the ratio of the medians.

This module is also the worker's app: ``--app postgres_finished:app``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

import dumbwaiter as dw

DSN = os.environ.get("DW_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench")
SCHEMA = os.environ.get("DW_BENCH_SCHEMA", "dw_finished_empty")
DONE = os.environ.get("DW_BENCH_DONE", "/tmp/dw-finished-done.log")

app = dw.App(f"{DSN}?schema={SCHEMA}&application_name=dw-finished-bench")
_fd: int | None = None


@app.task(name="noop")
async def noop(i: int) -> None:
    """Append ``i start end`` (one O_APPEND write): completion costs the queue nothing."""
    global _fd
    t = time.monotonic()
    if _fd is None:
        _fd = os.open(DONE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{i} {t:.6f} {time.monotonic():.6f}\n".encode())


PREFILL = """
INSERT INTO {schema}.dw_jobs (id, queue, name, kind, state, attempt, max_attempts,
    run_at, updated_at, worker, body, expires_at)
SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3)
        || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
    'default', 'prefill', 'task', 'succeeded', 1, 4, t, t, 'bench:1:abcd',
    convert_to('{{"id":"' || g || '","kind":"task","name":"prefill","queue":"default",'
        || '"args":[' || g || '],"kwargs":{{}},"headers":{{}},"attempt":0,"max_attempts":4,'
        || '"created_at":1700000000.0,"eta":null,"priority":0,"key":null,"errors":[]}}',
        'UTF8'),
    now() + interval '1 day'
FROM (SELECT g, now() - interval '1 day' + g * interval '86 microseconds' AS t,
        lpad(to_hex((extract(epoch FROM now() - interval '1 day') * 1000)::bigint
            + g * 86 / 1000), 12, '0') AS h,
        md5(g::text) AS r
      FROM generate_series(1, {rows}) AS g) AS x
"""


def _url(schema: str) -> str:
    return f"{DSN}?schema={schema}&application_name=dw-finished-bench"


def prepare(schema: str, rows: int) -> None:
    from dumbwaiter.brokers.postgres import PostgresBroker

    PostgresBroker(_url(schema)).migrate()
    with psycopg.connect(DSN, autocommit=True) as conn:
        have = conn.execute(
            f"SELECT count(*) FROM {schema}.dw_jobs WHERE name = 'prefill'"  # type: ignore[arg-type]
        ).fetchone()
        conn.execute(f"DELETE FROM {schema}.dw_jobs WHERE name <> 'prefill'")  # type: ignore[arg-type]
        if have is not None and have[0] == rows:
            return
        print(f"{schema}: writing {rows:,} finished rows ...", flush=True)
        conn.execute(f"TRUNCATE {schema}.dw_jobs")  # type: ignore[arg-type]
        # UUIDv7 ids whose milliseconds run through the past day, as a day
        # of production would leave them
        conn.execute(PREFILL.format(schema=schema, rows=rows).encode())
        conn.execute(f"VACUUM ANALYZE {schema}.dw_jobs")  # type: ignore[arg-type]


def run_once(schema: str, jobs: int) -> float:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {schema}.dw_jobs WHERE name <> 'prefill'")  # type: ignore[arg-type]
    producer = dw.App(_url(schema))
    task = producer.task(name="noop")(noop.fn)
    task.enqueue_many(range(jobs))
    producer.close()
    Path(DONE).write_bytes(b"")
    env = {
        **os.environ,
        "DW_BENCH_SCHEMA": schema,
        "DW_BENCH_DONE": DONE,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", "postgres_finished:app"]
    worker = subprocess.Popen([*cmd, "-q", "default", "--log-level", "warning"], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            lines = Path(DONE).read_text().splitlines()
            if len(lines) >= jobs:
                break
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"drain did not finish: {len(lines)} of {jobs}")
            time.sleep(0.02)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    recs = [line.split() for line in Path(DONE).read_text().splitlines()]
    first = min(float(r[1]) for r in recs)
    last = max(float(r[2]) for r in recs)
    return len({r[0] for r in recs}) / (last - first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    empty, full = "dw_finished_empty", "dw_finished_full"
    prepare(empty, 0)
    prepare(full, args.rows)
    rates: dict[str, list[float]] = {empty: [], full: []}
    for rep in range(args.reps):
        order = (empty, full) if rep % 2 == 0 else (full, empty)
        for schema in order:
            rate = run_once(schema, args.jobs)
            rates[schema].append(rate)
            print(f"rep {rep + 1} {schema}: {rate:,.0f} jobs/s", flush=True)
    e, f = statistics.median(rates[empty]), statistics.median(rates[full])
    print(
        f"median drain: empty {e:,.0f} jobs/s, with {args.rows:,} finished rows {f:,.0f} jobs/s;"
        f" ratio {f / e:.3f} ({(f / e - 1) * 100:+.1f}%)"
    )


if __name__ == "__main__":
    main()
