"""Publish-to-handle throughput of events with three subscriber groups, on Redis.

    python benchmarks/events_redis.py [--events 5000] [--concurrency 32]
        [--url redis://127.0.0.1:6379/1]

The Redis twin of benchmarks/events_sqlite.py (same app, benchmarks/events_app.py):
publishes N events one at a time from a sync producer (`app.publish`: one
script call that appends the event to its type's stream), then starts ONE
worker process (`dumbwaiter worker`) and measures how fast it handles the 3N
deliveries (each group's consumer group read into jobs by the worker's
fetch): first handler start to last.  Then, with the worker idle, publishes
--latency events 20 ms apart and reports publish-to-handler-start latency
(CLOCK_MONOTONIC in both processes).  Last, the memory the log takes per
event (`MEMORY USAGE` of the stream and of the de-duplication set).

Runs under a fresh prefix (`bench-events-<pid>`) and deletes its keys at the
end; nothing else on the server is touched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
QUANTILES = (0.5, 0.95, 0.99)


def _wait_lines(log: Path, n: int, timeout: float = 300.0) -> list[str]:
    """The handlers' log lines once there are ``n`` of them (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=int, default=300, help="events of the latency phase")
    ap.add_argument("--url", default="redis://127.0.0.1:6379/1")
    args = ap.parse_args()
    prefix = f"bench-events-{os.getpid()}"
    client = redis.Redis.from_url(args.url)
    with tempfile.TemporaryDirectory(prefix="dw-events-") as tmp:
        log = Path(tmp) / "handled.log"
        os.environ["DW_EVENTS_URL"] = f"{args.url}?prefix={prefix}"
        os.environ["DW_EVENTS_LOG"] = str(log)
        sys.path.insert(0, str(HERE))
        import events_app

        try:
            t0 = time.perf_counter()
            for n in range(args.events):
                events_app.app.publish(events_app.OrderCreated(n=n))
            publish_s = time.perf_counter() - t0
            stream = f"{{dw:{prefix}}}:ev:bench.order_created"
            log_bytes = client.memory_usage(stream, samples=0) or 0
            seen_bytes = client.memory_usage(f"{{dw:{prefix}}}:evx", samples=0) or 0
            expected = 3 * args.events
            # the worker imports what this process does (PYTHONPATH=export/src, say)
            pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
            worker = subprocess.Popen(
                [sys.executable, "-m", "dumbwaiter", "worker", "--app", "events_app:app",
                 "-c", str(args.concurrency), "--log-level", "WARNING"],
                cwd=HERE, env={**os.environ, "PYTHONPATH": pythonpath},
            )  # fmt: skip
            try:
                lines = _wait_lines(log, expected)
                # latency: the worker is idle now; publish one event every
                # 20 ms and time each delivery's start from its publish
                published: dict[int, float] = {}
                for n in range(args.events, args.events + args.latency):
                    published[n] = time.monotonic()
                    events_app.app.publish(events_app.OrderCreated(n=n))
                    time.sleep(0.02)
                late = _wait_lines(log, expected + 3 * args.latency)[expected:]
            finally:
                worker.terminate()
                worker.wait(30)
        finally:
            events_app.app.close()
            keys = list(client.scan_iter(match=f"{{dw:{prefix}}}:*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i : i + 1000])
            client.close()
        stamps = sorted(float(line.split()[2]) for line in lines)
        groups = {line.split()[0] for line in lines}
        handled_s = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
        print(f"events published one at a time: {args.events / publish_s:,.0f}/s")
        print(
            f"deliveries handled: {len(lines):,} of {expected:,} ({len(groups)} groups) "
            f"at {len(lines) / handled_s:,.0f}/s by one worker process (-c {args.concurrency})"
        )
        waits = sorted(
            (float(t) - published[int(n)]) * 1000 for _, n, t in (x.split() for x in late)
        )
        if os.environ.get("DW_BENCH_DEBUG"):
            by_group: dict[str, list[float]] = {}
            for g, n, t in (x.split() for x in late):
                by_group.setdefault(g, []).append((float(t) - published[int(n)]) * 1000)
            for g, w in by_group.items():
                w.sort()
                print(g, [round(w[int(len(w) * q)], 2) for q in QUANTILES])
        if waits:
            p50, p95, p99 = (
                waits[min(len(waits) - 1, int(len(waits) * q))] for q in (0.5, 0.95, 0.99)
            )
            print(
                f"publish to handler start, idle worker ({len(waits)} deliveries of "
                f"{args.latency} events published 20 ms apart): "
                f"p50 {p50:.2f} ms, p95 {p95:.2f} ms, p99 {p99:.2f} ms"
            )
        print(
            f"log memory: {log_bytes / args.events:,.0f} B/event in the stream, "
            f"{seen_bytes / args.events:,.0f} B/event in the de-duplication set"
        )


if __name__ == "__main__":
    main()
