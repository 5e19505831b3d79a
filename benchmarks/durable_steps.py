"""A durable workflow's step against a chain link, on SQLite, Redis and PostgreSQL.

The same five trivial calls (``x + 1``), made N times two ways on each
broker, in one run:

* ``chain``: ``dw.chain(inc.s(0), inc.s(), inc.s(), inc.s(), inc.s())``, five
  jobs one after the other (each link enqueues the next before its ack);
* ``durable``: an ``@app.workflow`` whose five ``ctx.step`` calls run in
  one segment job (each step: an ownership read of the run record and a
  ``kv_add`` of its checkpoint; the run: a record create, a completion
  update and the checkpoints' retention write).

All N flows are started first (timed apart: ``start/s``), then one
in-process worker (concurrency 32) drains them (``drain`` time).  A step's
cost is the drain time over N x 5, for both; ``ratio`` = durable step ÷ chain
link (the target: at most 1.5).  The order of the two alternates between
repetitions, and each repetition uses a fresh namespace.

    PYTHONPATH=src .venv/bin/python benchmarks/durable_steps.py [--runs 500] [--reps 3]
        [--brokers sqlite,redis,postgres]

Servers: Redis 127.0.0.1:6379, PostgreSQL 127.0.0.1:5432 database ``test``
(trust auth), as on the development machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

import dumbwaiter as dw
from dumbwaiter.testing import drain

STEPS = 5


def _url(broker: str, tmp: str) -> str:
    tag = uuid.uuid4().hex[:10]
    if broker == "sqlite":
        return f"sqlite:///{tmp}/bench-{tag}.db"
    if broker == "redis":
        return f"redis://127.0.0.1:6379/0?prefix=bench-durable-{tag}"
    if broker == "postgres":
        return f"postgresql://postgres@127.0.0.1:5432/test?schema=bench_durable_{tag}&migrate=auto"
    raise SystemExit(f"unknown broker {broker}")


def _app(url: str) -> tuple[dw.App, Callable[[int], object], Callable[[int], object]]:
    app = dw.App(url)

    @app.task(name="bench.inc")
    async def inc(x: int) -> int:
        return x + 1

    async def step(x: int) -> int:
        return x + 1

    @app.workflow(name="bench.flow")
    async def flow(ctx: dw.AsyncWorkflowContext, x: int) -> int:
        for i in range(STEPS):
            x = await ctx.step(f"s{i}", step, x)
        return x

    def chain(i: int) -> object:
        return dw.chain(inc.s(i), *(inc.s() for _ in range(STEPS - 1))).aenqueue()

    def durable(i: int) -> object:
        return flow.aenqueue(i)

    return app, chain, durable


async def _measure(broker: str, kind: str, runs: int, tmp: str) -> tuple[float, float]:
    """(starts per second, drain seconds) of ``runs`` flows of ``kind``."""
    app, chain, durable = _app(_url(broker, tmp))
    start = chain if kind == "chain" else durable
    try:
        await app.broker.open()
        await drain(app)  # the queues and tables exist before the clock starts
        t0 = time.perf_counter()
        handles = [await start(i) for i in range(runs)]  # type: ignore[misc]
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        await drain(app, concurrency=32, timeout=600)
        drained = time.perf_counter() - t1
        last = handles[-1]
        got = await last.aresult(timeout=5)  # type: ignore[attr-defined]
        assert got == runs - 1 + STEPS, f"{kind} on {broker}: got {got}"
        return runs / started, drained
    finally:
        await app.aclose()


def _median(xs: list[float]) -> str:
    return (
        f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"
        if len(xs) > 1
        else f"{xs[0]:.3g}"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--brokers", default="sqlite,redis,postgres")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dw-durable-bench-")
    print(
        f"{args.runs} flows of {STEPS} trivial steps, {args.reps} repetition(s), median (min-max)"
    )
    print()
    header = (
        "| broker | chain flows/s | durable runs/s | chain link ms | durable step ms | "
        "ratio | chain start/s | durable start/s |"
    )
    print(header)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for broker in args.brokers.split(","):
        res: dict[str, dict[str, list[float]]] = {
            k: {"rate": [], "step": [], "start": []} for k in ("chain", "durable")
        }
        ratios = []
        for rep in range(args.reps):
            order = ("chain", "durable") if rep % 2 == 0 else ("durable", "chain")
            per_step = {}
            for kind in order:
                start_rate, drained = await _measure(broker, kind, args.runs, tmp)
                res[kind]["rate"].append(args.runs / drained)
                per_step[kind] = drained / (args.runs * STEPS) * 1000
                res[kind]["step"].append(per_step[kind])
                res[kind]["start"].append(start_rate)
            ratios.append(per_step["durable"] / per_step["chain"])
        c, d = res["chain"], res["durable"]
        print(
            f"| {broker} | {_median(c['rate'])} | {_median(d['rate'])} | {_median(c['step'])} | "
            f"{_median(d['step'])} | {_median(ratios)} | {_median(c['start'])} | "
            f"{_median(d['start'])} |",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
