"""What finished jobs cost the broker: bytes kept per succeeded job.

    PYTHONPATH=src .venv/bin/python benchmarks/finished_cost.py [--jobs 20000]
        [--brokers sqlite,redis,postgres,nats,rabbitmq,kafka] [--json]
    PYTHONPATH=src .venv/bin/python benchmarks/finished_cost.py --kv-floor

Each broker gets a fresh namespace.  ``--jobs`` no-op jobs whose one
argument is a 500-character string are bulk-enqueued and run by a
``dumbwaiter.Worker`` in this process (concurrency 50, the default
retention of an hour, so nothing is pruned yet); then what the broker's
storage grew by is divided by the jobs:

- Redis: ``INFO memory`` ``used_memory``, on a ``redis-server`` of its own
  that this script starts (``--redis-port``; no persistence), so nobody
  else's keys move the figure; plus ``MEMORY USAGE`` of one job's key.
- PostgreSQL: ``pg_total_relation_size`` of the schema's job table (heap,
  TOAST and indexes) after ``VACUUM FULL``: the live rows, without the dead
  versions a plain ``VACUUM`` leaves for reuse.
- SQLite: the database file after ``VACUUM`` (its WAL checkpointed).
- NATS: the bytes of the namespace's streams and KV bucket.
- RabbitMQ, Kafka: their state store's bytes (the records, on the private
  Redis; RabbitMQ's queues hold nothing once jobs are acked, Kafka's topics
  keep the messages for the topic's own retention, not counted), once a
  rescue dropped the settled jobs' lease entries (``settled_leases_gone``).

"beyond args" subtracts the argument's bytes when the broker still keeps
them (one job's record is read back to see: ``JobInfo.compact``).  The
figures are in docs/benchmarks.md ("What finished jobs cost the broker").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dumbwaiter as dw

ARG = "x" * 500
PG = os.environ.get("DW_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
NATS = os.environ.get("DW_BENCH_NATS", "nats://127.0.0.1:4222")
AMQP = os.environ.get("DW_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
KAFKA = os.environ.get("DW_BENCH_KAFKA", "")  # host:port; empty: skipped
ALL = ("sqlite", "redis", "postgres", "nats", "rabbitmq", "kafka")


@dataclass
class Figure:
    broker: str
    jobs: int
    bytes_total: int
    per_job: float
    beyond_args: float
    compact: bool
    note: str = ""


class PrivateRedis:
    """A redis-server of this run only (no persistence), for clean deltas."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="dw-finished-")
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not on PATH")
        self.proc = subprocess.Popen(
            [exe, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )
        import redis

        self.client = redis.Redis(port=port)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def used(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


async def run_jobs(url: str, n: int) -> tuple[str, bool]:
    """Enqueue and run ``n`` no-op jobs; the id of one and whether its record
    is compact."""
    app = dw.App(url)
    done = asyncio.Event()
    ran = [0]

    @app.task(name="noop")
    async def noop(arg: str) -> None:
        ran[0] += 1
        if ran[0] >= n:
            done.set()

    jobs = []
    for start in range(0, n, 5000):
        jobs += await noop.aenqueue_many([(ARG,)] * min(5000, n - start))
    worker = dw.Worker(app, queues=("default",), concurrency=50)
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 600)
    # every ack written: the succeeded count says so
    for _ in range(600):
        [s] = [s for s in await app.broker.stats() if s.queue == "default"]
        if s.succeeded >= n:
            break
        await asyncio.sleep(0.1)
    worker.stop()
    await runner
    info = await app.broker.get(jobs[0].id)
    await app.aclose()
    assert info is not None and info.state is dw.State.SUCCEEDED, info
    return jobs[0].id, bool(getattr(info, "compact", False))


def figure(name: str, n: int, grew: int, compact: bool, note: str = "") -> Figure:
    per = grew / n
    return Figure(name, n, grew, per, per - (0 if compact else len(ARG)), compact, note)


async def warm_up(r: PrivateRedis) -> None:
    """Run a few jobs on another prefix first: the server's script cache and
    the like are then in the baseline, not in the figure."""
    await run_jobs(f"{r.url}?prefix=fcwarm{uuid.uuid4().hex[:6]}", 200)


async def on_redis(r: PrivateRedis, n: int) -> Figure:
    await warm_up(r)
    prefix = f"fc{uuid.uuid4().hex[:6]}"
    before = r.used()
    id_, compact = await run_jobs(f"{r.url}?prefix={prefix}", n)
    grew = r.used() - before
    one = r.client.memory_usage(f"{{dw:{prefix}}}:job:{id_}")
    return figure("redis", n, grew, compact, f"MEMORY USAGE of one job key: {one} B")


async def on_state_store(name: str, base: str, r: PrivateRedis, n: int) -> Figure:
    from urllib.parse import quote

    prefix = f"fc{uuid.uuid4().hex[:6]}"
    state = f"{r.url}?prefix={prefix}s"
    await warm_up(r)
    before = r.used()
    url = f"{base}?prefix={prefix}&state={quote(state, safe='')}"
    try:
        _, compact = await run_jobs(url, n)
        await settled_leases_gone(url)
        return figure(name, n, r.used() - before, compact, "the state store (Redis)")
    finally:
        if name == "rabbitmq":
            await _drop_rabbitmq(prefix)


async def settled_leases_gone(url: str) -> None:
    """Kafka keeps a settled job's lease entry a moment (``SETTLED_TTL``),
    then a worker's next rescue drops it: wait that moment and rescue once,
    so the figure is what stays for the retention, not what goes within
    seconds.  (RabbitMQ keeps one lease entry per worker, not per job.)"""
    from dumbwaiter.brokers.kafka.records import SETTLED_TTL

    await asyncio.sleep(SETTLED_TTL + 0.5)
    app = dw.App(url)
    try:
        await app.broker.open()
        await app.broker.rescue()
    finally:
        await app.aclose()


async def _drop_rabbitmq(prefix: str) -> None:
    """Delete the quorum queues and exchanges the run declared on the server."""
    import aiormq

    from dumbwaiter.brokers.rabbitmq import announce
    from dumbwaiter.brokers.rabbitmq.topology import LANES, Topology

    names = Topology(prefix, "dw.delay")
    conn = await aiormq.connect(AMQP)
    try:
        ch = await conn.channel()
        for lane in LANES:
            await ch.queue_delete(names.lane("default", lane), if_unused=False, if_empty=False)
        await ch.queue_delete(names.dlq("default"), if_unused=False, if_empty=False)
        for x in (names.dlx, names.events):
            await ch.exchange_delete(x)
        await ch.queue_delete(announce.name(prefix), if_unused=False, if_empty=False)
        await ch.exchange_delete(announce.name(prefix))
    finally:
        await conn.close()


async def on_postgres(n: int) -> Figure:
    import psycopg

    schema = f"dw_finished_{uuid.uuid4().hex[:6]}"
    url = f"{PG}?schema={schema}"
    from dumbwaiter.brokers.postgres import PostgresBroker

    PostgresBroker(url).migrate()

    def size() -> int:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"VACUUM FULL {schema}.dw_jobs")  # type: ignore[arg-type]
            row = c.execute(
                f"SELECT pg_total_relation_size('{schema}.dw_jobs')"  # type: ignore[arg-type]
            ).fetchone()
            assert row is not None
            return int(row[0])

    try:
        before = size()
        _, compact = await run_jobs(url, n)
        return figure("postgres", n, size() - before, compact, "dw_jobs after VACUUM FULL")
    finally:
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


async def on_sqlite(n: int) -> Figure:
    d = tempfile.mkdtemp(prefix="dw-finished-")
    path = Path(d) / "jobs.db"

    def size() -> int:
        with sqlite3.connect(path) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c = sqlite3.connect(path)
        c.execute("VACUUM")
        c.close()
        return path.stat().st_size

    try:
        url = f"sqlite:///{path}"
        app = dw.App(url)
        await app.broker.open()  # the schema, so the baseline has it
        await app.aclose()
        before = size()
        _, compact = await run_jobs(url, n)
        return figure("sqlite", n, size() - before, compact, "the file after VACUUM")
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def on_nats(n: int) -> Figure:
    import nats

    from dumbwaiter.brokers.nats.names import stream_names

    prefix = f"fc{uuid.uuid4().hex[:6]}"
    nc = await nats.connect(NATS)
    js = nc.jetstream()

    async def size() -> int:
        total = 0
        for s in stream_names(prefix):
            try:
                total += (await js.stream_info(s)).state.bytes
            except nats.js.errors.NotFoundError:
                pass
        return total

    try:
        before = await size()
        _, compact = await run_jobs(f"{NATS}?prefix={prefix}", n)
        grew = await size() - before
        return figure("nats", n, grew, compact, "streams + KV bucket bytes")
    finally:
        for s in stream_names(prefix):
            try:
                await js.delete_stream(s)
            except nats.js.errors.NotFoundError:
                pass
        await nc.close()


async def kv_floor(redis_port: int, n: int) -> None:
    """What one entry of a Redis state store costs before its value: ``n``
    entries named as RabbitMQ names a job's record (54 characters), each with
    a one-byte value and a ttl (the retention), written with ``kv_set``.  The
    record engines' figures are this plus their record's bytes."""
    from dumbwaiter.message import uuid7

    r = PrivateRedis(redis_port)
    try:
        await warm_up(r)
        app = dw.App(f"{r.url}?prefix=fl{uuid.uuid4().hex[:6]}s")
        await app.broker.open()
        await app.broker.kv_set({"warm": b"1"}, ttl=3600)
        before = r.used()
        for start in range(0, n, 1000):
            names = [f"_rmq.fc123456:job:{uuid7()}" for _ in range(min(1000, n - start))]
            await app.broker.kv_set(dict.fromkeys(names, b"v"), ttl=3600)
        per = (r.used() - before) / n
        await app.aclose()
        print(f"a Redis state-store entry (54-character name, 1-byte value, a ttl): {per:.0f} B")
    finally:
        r.close()


async def measure(names: list[str], n: int, redis_port: int) -> list[Figure]:
    out: list[Figure] = []
    r = PrivateRedis(redis_port)
    try:
        runs: dict[str, Callable[[], Awaitable[Figure]]] = {
            "sqlite": lambda: on_sqlite(n),
            "redis": lambda: on_redis(r, n),
            "postgres": lambda: on_postgres(n),
            "nats": lambda: on_nats(n),
            "rabbitmq": lambda: on_state_store("rabbitmq", AMQP.rstrip("/") + "/", r, n),
            "kafka": lambda: on_state_store("kafka", f"kafka://{KAFKA}", r, n),
        }
        for name in names:
            if name == "kafka" and not KAFKA:
                print("kafka: skipped (set DW_BENCH_KAFKA=host:port)", flush=True)
                continue
            try:
                f = await runs[name]()
            except Exception as exc:  # a server not reachable: say so, go on
                print(f"{name}: skipped ({type(exc).__name__}: {exc})", flush=True)
                continue
            out.append(f)
            print(
                f"{f.broker:9} {f.per_job:8.0f} B/job  beyond args {f.beyond_args:8.0f} B"
                f"  compact={f.compact}  ({f.note})",
                flush=True,
            )
    finally:
        r.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--brokers", default=",".join(ALL))
    ap.add_argument("--redis-port", type=int, default=6395)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--kv-floor",
        action="store_true",
        help="measure what one Redis state-store entry costs before its value, and stop",
    )
    a = ap.parse_args()
    if a.kv_floor:
        asyncio.run(kv_floor(a.redis_port, a.jobs))
        return
    names = [b.strip() for b in a.brokers.split(",") if b.strip()]
    unknown = set(names) - set(ALL)
    if unknown:
        raise SystemExit(f"unknown brokers: {sorted(unknown)} (known: {', '.join(ALL)})")
    figures = asyncio.run(measure(names, a.jobs, a.redis_port))
    if a.json:
        rows: list[dict[str, Any]] = [asdict(f) for f in figures]
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
