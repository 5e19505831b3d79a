"""Where a W3 pickup's time goes on the RabbitMQ broker: timestamps of each
step in the worker, as ``benchmarks/nats_w3_steps.py`` does for NATS.

A W3-like run (one worker process, a warm-up job, 2 s idle, then N jobs 5 ms
apart) with the worker's steps stamped by wrapping functions from outside
(nothing in ``src`` is changed):

* ``read``: the connection's first bytes after the producer's call;
* ``ondeliv``: the delivery assembled, by aiormq's channel handling the
  ``Basic.Deliver``;
* ``deliv``: the link's consumer making the copy (``Raw``);
* ``woke`` / ``watch1``: the fetch awake, past ``_watch``;
* ``admit0`` / ``admit1``: the admission (one ``kv_update`` of the state
  store: the record read, the lease written);
* ``fetched``: the fetch's return; ``start``: the handler's start.

Each is the median over jobs, in ms after the producer's call, with the
worker thread's CPU time beside the wall time for the spans between them;
then the state store's calls in the worker (count, keys, p50 wall and CPU,
and ``decide``: the admission's own Python inside its ``kv_update``).

    PYTHONPATH=SNAPSHOT/src .venv/bin/python benchmarks/rabbitmq_w3_steps.py [--n 400]

Queues under the prefix ``w3s`` on ``DW_ENQ_AMQP`` (the records in
``/tmp/w3s-state.db``), deleted by the next run before it starts.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import itertools
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nats_w3_steps import event_log, main, report, run_worker, started, w3
from rabbitmq_enqueue import delete_topology

import dumbwaiter as dw

AMQP = os.environ.get("DW_ENQ_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
STATE = "/tmp/w3s-state.db"
URL = f"{AMQP}?prefix=w3s&delays=w3s.delay&state={quote(f'sqlite:///{STATE}', safe='')}"
app = dw.App(URL)


@app.task(name="noop")
async def noop(i: int) -> None:
    started(i)


STEPS: tuple[str, ...] = ("read", "ondeliv", "deliv", "woke", "watch1", "admit0")
STEPS += ("admit1", "fetched", "start")
SPANS = tuple(itertools.pairwise(STEPS[:-1]))


def _instrument(path: str) -> None:  # noqa: C901 (one wrapper a step)
    """Wrap the worker's pickup steps (in the worker process)."""
    import aiormq

    from dumbwaiter.brokers.rabbitmq import broker as B
    from dumbwaiter.brokers.rabbitmq import link as L
    from dumbwaiter.brokers.sqlite import broker as S

    note = event_log(path)
    calls: list[tuple[str, int, float, float]] = []

    def dump() -> None:
        by: dict[tuple[str, int], list[tuple[float, float]]] = collections.defaultdict(list)
        for n, k, w, c in calls:
            by[(n, k)].append((w, c))
        with open(path + ".kv", "w") as f:
            for (n, k), xs in sorted(by.items(), key=lambda e: -len(e[1])):
                ws, cs = sorted(x[0] for x in xs), sorted(x[1] for x in xs)
                f.write(
                    f"  {n} keys={k} calls={len(xs)}: p50 {ws[len(ws) // 2] * 1e6:.0f} us wall, "
                    f"{cs[len(cs) // 2] * 1e6:.0f} us CPU\n"
                )

    atexit.register(dump)

    def stamp_sync(owner: Any, name: str, step: str) -> None:
        f = getattr(owner, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            note(step)
            return f(*a, **k)

        setattr(owner, name, wrapped)

    stamp_sync(asyncio.StreamReader, "feed_data", "read")
    stamp_sync(L.Raw, "__init__", "deliv")
    on_deliver = aiormq.Channel._on_deliver_frame

    async def _on_deliver(self: Any, *a: Any) -> Any:
        note("ondeliv")
        return await on_deliver(self, *a)

    setattr(aiormq.Channel, "_on_deliver_frame", _on_deliver)  # noqa: B010
    for name, before, after in (("_watch", "woke", "watch1"), ("_admit", "admit0", "admit1")):
        f = getattr(B.RabbitMQBroker, name)

        async def around(self: Any, *a: Any, _f: Any = f, _b: str = before, _e: str = after) -> Any:
            note(_b)
            try:
                return await _f(self, *a)
            finally:
                note(_e)

        setattr(B.RabbitMQBroker, name, around)
    fetch = B.RabbitMQBroker.fetch

    async def _fetch(self: Any, *a: Any, **k: Any) -> Any:
        ds = await fetch(self, *a, **k)
        if ds:
            note("fetched")
        return ds

    setattr(B.RabbitMQBroker, "fetch", _fetch)  # noqa: B010
    for name in ("kv_update", "kv_get", "kv_set", "kv_add", "kv_scan", "kv_delete"):
        f = getattr(S.SQLiteBroker, name)

        async def timed(self: Any, *a: Any, _f: Any = f, _n: str = name, **k: Any) -> Any:
            if _n == "kv_update":
                decide = a[1]

                def timed_decide(got: Any, _d: Any = decide) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return _d(got)
                    finally:
                        calls.append(("decide", len(got), time.perf_counter() - t0, 0.0))

                a = (a[0], timed_decide)
            t, c = time.perf_counter(), time.thread_time()
            try:
                return await _f(self, *a, **k)
            finally:
                n = len(a[0]) if a and hasattr(a[0], "__len__") else -1
                calls.append((_n, n, time.perf_counter() - t, time.thread_time() - c))

        setattr(S.SQLiteBroker, name, timed)


def worker() -> None:
    run_worker("rabbitmq_w3_steps", _instrument)


def _fresh_state() -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(STATE + suffix).unlink(missing_ok=True)


def _report(calls: dict[int, float], d: str) -> None:
    report(calls, f"{d}/done", f"{d}/steps", STEPS, STEPS[:-1], SPANS)
    print("state store calls in the worker:")
    print(Path(f"{d}/steps.kv").read_text(), end="")


async def _clear() -> None:
    """Delete the queues an earlier run left: one that failed leaves its
    copies queued, and this run's worker would pick them up."""
    import aiormq

    conn = await aiormq.connect(AMQP)
    try:
        await delete_topology(await conn.channel(), app.broker)
    finally:
        await conn.close()


async def produce(n: int, d: str) -> None:
    _fresh_state()
    await _clear()
    _report(await w3(app, noop, n, d, __file__), d)


if __name__ == "__main__":
    main(worker, produce)
