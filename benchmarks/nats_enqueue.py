"""Enqueue paths of the NATS broker next to bare nats-py, in one run.

    .venv/bin/python benchmarks/nats_enqueue.py [--server nats://127.0.0.1:4222]
        [--n 10000] [--reps 3] [--json out.json]

For each repetition, on a fresh namespace (deleted afterwards), it measures:

* ``bare js.publish 1x1``: ``await js.publish`` one at a time (each waits
  for its PubAck) to a file-storage stream: the harness' anchor;
* ``bare publish_async 1000``: ``js.publish_async`` with 1,000 in flight;
* ``aenqueue 1x1``: ``await task.aenqueue(i)`` one at a time;
* ``enqueue 1x1 (sync)``: ``task.enqueue(i)`` from plain code: nats-py is
  asyncio-only, so each call hops to the App's portal thread;
* ``aenqueue concurrent``: 1,000 coroutines enqueuing one job at a time each
  (a web server's request handlers), ``n`` jobs in all;
* ``aenqueue_many``: one bulk call.

Prints the medians (jobs or publishes per second) and the ratios the targets
use; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import dumbwaiter as dw
from dumbwaiter.brokers.nats.names import stream_names


async def _bare(server: str, n: int) -> dict[str, float]:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(server)
    js = nc.jetstream()
    name = f"dwbench_{secrets.token_hex(4)}"
    subject = f"dwbench.{name}"
    out: dict[str, float] = {}
    try:
        await js.add_stream(StreamConfig(name=name, subjects=[subject]))
        payload = b"x" * 250
        t0 = time.perf_counter()
        for _ in range(n // 4):
            await js.publish(subject, payload)
        out["bare js.publish 1x1"] = (n // 4) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        done = 0
        while done < n:
            futs = [await js.publish_async(subject, payload) for _ in range(1000)]
            for f in futs:
                await f
            done += 1000
        out["bare publish_async 1000"] = done / (time.perf_counter() - t0)
    finally:
        await js.delete_stream(name)
        await nc.close()
    return out


def _app(server: str) -> tuple[dw.App, dw.Task, str]:
    ns = f"bench{secrets.token_hex(3)}"
    app = dw.App(f"{server}?prefix={ns}")

    @app.task(name="noop")
    async def noop(i: int) -> None: ...

    return app, noop, ns


async def _timed(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    t0 = time.perf_counter()
    await fn()
    return n / (time.perf_counter() - t0)


async def _dumbwaiter_async(server: str, n: int) -> tuple[dict[str, float], str]:
    app, noop, ns = _app(server)
    await app.broker.open()
    await noop.aenqueue(-1)  # queue registered, connection warm
    out: dict[str, float] = {}

    async def one_by_one() -> None:
        for i in range(n // 4):
            await noop.aenqueue(i)

    async def concurrent() -> None:
        todo = iter(range(n))

        async def producer() -> None:  # one of 1,000 request handlers
            for i in todo:
                await noop.aenqueue(i)

        await asyncio.gather(*(producer() for _ in range(1000)))

    try:
        out["aenqueue 1x1"] = await _timed(one_by_one, n // 4)
        out["aenqueue concurrent"] = await _timed(concurrent, n)
        out["aenqueue_many"] = await _timed(lambda: noop.aenqueue_many(range(n)), n)
    finally:
        await app.aclose()
    return out, ns


def _dumbwaiter_sync(server: str, n: int) -> tuple[dict[str, float], str]:
    app, noop, ns = _app(server)
    noop.enqueue(-1)
    try:
        t0 = time.perf_counter()
        for i in range(n // 4):
            noop.enqueue(i)
        return {"enqueue 1x1 (sync)": (n // 4) / (time.perf_counter() - t0)}, ns
    finally:
        app.close()


async def _delete(server: str, namespaces: list[str]) -> None:
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(server)
    js = nc.jetstream()
    try:
        for ns in namespaces:
            for s in stream_names(ns):
                try:
                    await js.delete_stream(s)
                except NotFoundError:
                    pass
    finally:
        await nc.close()


def run_once(server: str, n: int) -> dict[str, float]:
    out = asyncio.run(_bare(server, n))
    figures, ns1 = asyncio.run(_dumbwaiter_async(server, n))
    out.update(figures)
    result: list[tuple[dict[str, float], str]] = []
    # plain code, as a Flask view would call it (a thread without a loop)
    t = threading.Thread(target=lambda: result.append(_dumbwaiter_sync(server, n)))
    t.start()
    t.join()
    figures, ns2 = result[0]
    out.update(figures)
    asyncio.run(_delete(server, [ns1, ns2]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="nats://127.0.0.1:4222")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    runs = [run_once(args.server, args.n) for _ in range(args.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    width = max(len(k) for k in med)
    for k, v in med.items():
        lo, hi = min(r[k] for r in runs), max(r[k] for r in runs)
        print(f"{k:<{width}}  {v:>9,.0f}/s  ({lo:,.0f}-{hi:,.0f})")
    bare = med["bare js.publish 1x1"]
    print(f"aenqueue 1x1 / bare js.publish 1x1          {med['aenqueue 1x1'] / bare:.2f}")
    print(f"enqueue 1x1 (sync) / bare js.publish 1x1    {med['enqueue 1x1 (sync)'] / bare:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"runs": runs, "median": med, "n": args.n, "server": args.server}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
