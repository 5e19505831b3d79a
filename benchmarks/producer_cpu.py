"""CPU per call of the one-at-a-time producer paths in the core.

What one ``task.enqueue(i)``, ``await task.aenqueue(i)`` or ``app.publish(e)``
costs this process above the broker seam: the argument checks, the id, the
``Message``, its headers, middleware, the sync bridge.  CPU time
(``time.process_time``, every thread of the process), not wall time, so the
figure does not move with the load of a shared machine.  Best of
``--repeat`` runs of ``-n`` calls, in microseconds per call:

    enqueue          task.enqueue(i), broker with a sync producer (``null``)
    aenqueue         await task.aenqueue(i)
    options.enqueue  task.options(priority=1).enqueue(i) (options bound once)
    enqueue+mw       task.enqueue(i) with a before/after_enqueue middleware
    aenqueue in job  await task.aenqueue(i) inside a running job (cause headers)
    enqueue portal   task.enqueue(i), broker without a sync producer: the
                     call hops to the App's portal thread (NATS, RabbitMQ)
    publish          app.publish(event)
    apublish         await app.apublish(event)
    memory enqueue   task.enqueue(i) on ``memory://`` (its storing included)
    memory aenqueue  await task.aenqueue(i) on ``memory://``

The ``null`` broker is ``memory://`` with enqueue and publish cut down to
what every broker does per message (``encode_checked``, the size check) and
returning the ids: what is left is the core's own cost.

    PYTHONPATH=src python benchmarks/producer_cpu.py [-n 20000] [--repeat 5]
    # an older tree side by side:
    git archive main src | tar -x -C /tmp/dw-main
    PYTHONPATH=/tmp/dw-main/src python benchmarks/producer_cpu.py

(``--json`` prints one JSON line; ``--profile PATH`` runs one path under
cProfile and prints its top functions.)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import json
import pstats
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import dumbwaiter as dw
from dumbwaiter.brokers.memory import MemoryBroker
from dumbwaiter.context import Context, reset_current, set_current
from dumbwaiter.message import Message, encode_checked


def _null(app: dw.App, *, sync: bool) -> None:
    """Cut ``app``'s memory broker down to the per-message work of any broker."""
    broker = app.broker
    assert isinstance(broker, MemoryBroker)
    limit = broker.max_message_size

    def enqueue_sync(msgs: Iterable[Message]) -> list[str]:
        return [m.id for m in msgs if encode_checked(m, limit)]

    async def enqueue(msgs: Iterable[Message]) -> list[str]:
        return [m.id for m in msgs if encode_checked(m, limit)]

    def publish_sync(msgs: Iterable[Message]) -> int:
        return sum(1 for m in msgs if encode_checked(m, limit))

    async def publish(msgs: Iterable[Message]) -> int:
        return sum(1 for m in msgs if encode_checked(m, limit))

    broker.enqueue_sync = enqueue_sync  # type: ignore[method-assign]
    broker.enqueue = enqueue  # type: ignore[method-assign]
    broker.publish_sync = publish_sync  # type: ignore[method-assign]
    broker.publish = publish  # type: ignore[method-assign]
    if not sync:  # as NATS and RabbitMQ: sync callers go through the portal
        broker.capabilities = dataclasses.replace(broker.capabilities, sync_enqueue=False)


class Stamp(dw.Middleware):
    """A middleware with enqueue hooks (as tracing and metrics have)."""

    def before_enqueue(self, message: Message) -> None:
        message.headers["stamp"] = 1

    def after_enqueue(self, message: Message, id: str) -> None:
        pass


class Happened(dw.Event, type="bench.happened"):
    i: int


async def anoop(i: int) -> None:  # the harness' task shape: one int argument
    pass


def _app(url: str = "memory://", *, sync: bool = True, mw: bool = False) -> tuple[dw.App, Any]:
    app = dw.App(url, middleware=[Stamp()] if mw else ())
    task = app.task(name="noop")(anoop)
    return app, task


def _cpu(fn: Callable[[int], None], n: int) -> float:
    gc.collect()
    t0 = time.process_time()
    fn(n)
    return time.process_time() - t0


def _acpu(fn: Callable[[int], Awaitable[None]], n: int) -> float:
    async def run() -> float:
        await fn(10)  # warm
        gc.collect()
        t0 = time.process_time()
        await fn(n)
        return time.process_time() - t0

    return asyncio.run(run())


def _loop(task: Any) -> Callable[[int], None]:
    def loop(n: int) -> None:
        for i in range(n):
            task.enqueue(i)

    return loop


def _aloop(task: Any) -> Callable[[int], Awaitable[None]]:
    async def loop(n: int) -> None:
        for i in range(n):
            await task.aenqueue(i)

    return loop


def enqueue(n: int) -> float:
    app, task = _app()
    _null(app, sync=True)
    return _cpu(_loop(task), n)


def enqueue_mw(n: int) -> float:
    app, task = _app(mw=True)
    _null(app, sync=True)
    return _cpu(_loop(task), n)


def options_enqueue(n: int) -> float:
    app, task = _app()
    _null(app, sync=True)
    return _cpu(_loop(task.options(priority=1)), n)


def enqueue_portal(n: int) -> float:
    app, task = _app()
    _null(app, sync=False)
    task.enqueue(-1)  # the portal thread started
    try:
        return _cpu(_loop(task), n)
    finally:
        app.close()


def aenqueue(n: int) -> float:
    app, task = _app()
    _null(app, sync=True)
    return _acpu(_aloop(task), n)


def aenqueue_in_job(n: int) -> float:
    app, task = _app()
    _null(app, sync=True)
    parent = task.message((0,), {}, dw.task.SendOptions())
    parent.headers["correlation_id"] = "c-1"
    inner = _aloop(task)

    async def loop(n: int) -> None:
        token = set_current(Context(parent, app, "w"))
        try:
            await inner(n)
        finally:
            reset_current(token)

    return _acpu(loop, n)


def publish(n: int) -> float:
    app, _ = _app()
    _null(app, sync=True)
    events = [Happened(i=i) for i in range(n)]

    def loop(n: int) -> None:
        for e in events[:n]:
            app.publish(e)

    return _cpu(loop, n)


def apublish(n: int) -> float:
    app, _ = _app()
    _null(app, sync=True)
    events = [Happened(i=i) for i in range(n + 10)]

    async def loop(n: int) -> None:
        for e in events[:n]:
            await app.apublish(e)

    return _acpu(loop, n)


def memory_enqueue(n: int) -> float:
    _, task = _app()
    return _cpu(_loop(task), n)


def memory_aenqueue(n: int) -> float:
    _, task = _app()
    return _acpu(_aloop(task), n)


#: each path: n -> CPU seconds for n calls
PATHS: dict[str, Callable[[int], float]] = {
    "enqueue": enqueue,
    "aenqueue": aenqueue,
    "options.enqueue": options_enqueue,
    "enqueue+mw": enqueue_mw,
    "aenqueue in job": aenqueue_in_job,
    "enqueue portal": enqueue_portal,
    "publish": publish,
    "apublish": apublish,
    "memory enqueue": memory_enqueue,
    "memory aenqueue": memory_aenqueue,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("-n", type=int, default=20_000, help="calls per run")
    p.add_argument("--repeat", type=int, default=5, help="runs per figure (best is kept)")
    p.add_argument("--only", nargs="*", default=None, help="paths to run")
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.add_argument("--profile", default="", help="run this path under cProfile")
    a = p.parse_args(argv)
    table = PATHS
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(table[a.profile], a.n)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    out: dict[str, float] = {}
    for name, fn in table.items():
        if a.only and name not in a.only:
            continue
        out[name] = min(fn(a.n) for _ in range(a.repeat)) / a.n * 1e6
        if not a.json:
            print(f"{name:<16} {out[name]:>7.2f} µs CPU/call")
            sys.stdout.flush()
    if a.json:
        print(json.dumps({"n": a.n, "cpu_us": out, "src": dw.__file__}))


if __name__ == "__main__":
    main()
