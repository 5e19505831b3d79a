"""The Kafka drain against its ceiling, in one run: the same no-op job
drained by the same in-process worker from Kafka (a Redis state store) and
from the Redis or memory broker, which bounds what any Kafka path through
this worker can do.

    PYTHONPATH=src .venv/bin/python benchmarks/kafka_drain.py [-n 10000] [--reps 3] \
        [--brokers kafka,redis,memory]

Per repetition and broker (the order rotates each repetition): ``n`` jobs
are enqueued with ``aenqueue_many`` (not timed), then a ``dw.Worker``
(concurrency 32, the CLI's default) drains them; the rate is ``n`` over
(last job's end - first job's start), as the peers harness counts W1's
drain; beside it, this process' CPU time a job from the worker's start to
the last job (the group join and the read-ahead included).  Kafka runs on
tansu started here (as ``kafka_bench.py``) unless ``DW_BENCH_KAFKA`` names
a cluster; the state store and the Redis broker use ``DW_BENCH_REDIS``
(default ``redis://127.0.0.1:6379/0``) under a prefix of the run's own.
With ``--profile DIR`` the Kafka drains are recorded by py-spy
(``--threads --nonblocking``, raw format) into DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from kafka_bench import REDIS, running_tansu

import dumbwaiter as dw


def url_of(broker: str, servers: str, prefix: str) -> str:
    if broker == "kafka":
        state = quote(f"{REDIS}?prefix={prefix}", safe="")
        return f"kafka://{servers}?prefix={prefix}&state={state}&session_timeout=2"
    if broker == "redis":
        return f"{REDIS}?prefix={prefix}"
    return "memory://"


def py_spy(out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording this process into ``out`` until it is interrupted."""
    exe = str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [exe, "record", "--threads", "--nonblocking", "--format", "raw", "--rate", "400",
         "-o", str(out), "--pid", str(os.getpid())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def drain(url: str, n: int, profile: Path | None) -> tuple[float, float]:
    """jobs/s of an in-process worker draining ``n`` no-op jobs, and this
    process' CPU time (user + system) a job over the drain, in µs."""
    app = dw.App(url)
    marks: list[float] = []
    done = asyncio.Event()

    @app.task(name="bench.noop")
    async def noop(i: int) -> None:
        marks.append(time.perf_counter())
        if len(marks) >= n:
            done.set()

    spy = None
    try:
        await app.broker.declare(["default"])
        for i in range(0, n, 1000):
            await noop.aenqueue_many(range(i, min(n, i + 1000)))
        if profile is not None:
            spy = py_spy(profile / f"kafka-{secrets.token_hex(3)}.txt")
        worker = dw.Worker(app, queues=("default",), concurrency=32)
        cpu = time.process_time()
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 600)
        cpu = time.process_time() - cpu
        worker.stop()
        await running
        return (n - 1) / (marks[-1] - marks[0]), cpu / n * 1e6
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
            spy.wait(30)
        await app.aclose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--brokers", default="kafka,redis,memory")
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    brokers = args.brokers.split(",")
    rates: dict[str, list[float]] = {b: [] for b in brokers}
    with running_tansu("kafka" in brokers) as servers:
        for rep in range(args.reps):
            order = brokers[rep % len(brokers) :] + brokers[: rep % len(brokers)]
            line = []
            for b in order:
                prefix = f"kd{secrets.token_hex(3)}"
                prof = args.profile if b == "kafka" else None
                r, cpu = asyncio.run(drain(url_of(b, servers, prefix), args.n, prof))
                rates[b].append(r)
                line.append(f"{b} {r:,.0f}/s ({cpu:.0f} µs CPU a job)")
            ratios = ""
            if "kafka" in rates and len(brokers) > 1:
                k = rates["kafka"][-1]
                ratios = " | " + ", ".join(
                    f"kafka/{b} {k / rates[b][-1]:.2f}" for b in brokers if b != "kafka"
                )
            print(f"rep {rep}: " + ", ".join(line) + ratios, flush=True)
        print(
            "median: " + ", ".join(f"{b} {statistics.median(v):,.0f}/s" for b, v in rates.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
