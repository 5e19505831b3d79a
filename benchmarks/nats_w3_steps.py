"""Where a W3 pickup's time goes on the NATS broker: timestamps of each step.

A W3-like run (one worker process, a warm-up job, 2 s idle, then N jobs 5 ms
apart, as the peers harness' W3) with the worker's steps stamped by wrapping
the broker's functions from outside (nothing in ``src`` is changed): the
pointer parsed by the puller's read callback, the claim being built, its
socket write (start and end), the claim's PubAck read, the fetch's return,
the handler's start.  Each is printed as the median over jobs, in ms after
the producer's call, with the worker thread's CPU time beside the wall time
for three spans (CPU close to wall: our own Python; far below it: waiting
for a core or for the server).

    PYTHONPATH=SNAPSHOT/src .venv/bin/python benchmarks/nats_w3_steps.py [--n 400]

Works on the code before and after the claim moved into the read callback
(``_claim_send`` / ``_claim_one``: whichever exists is stamped).  A fresh
namespace ``w3steps`` on ``NATS_URL`` (default nats://127.0.0.1:4222).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

import dumbwaiter as dw

URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222") + "?prefix=w3steps"
app = dw.App(URL)
_fd: list[int] = []


def started(i: int) -> None:
    """The handler's start of job ``i``, a line in the worker's log (W3_DONE)."""
    t = time.time()
    if not _fd:
        _fd.append(os.open(os.environ["W3_DONE"], os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    os.write(_fd[0], f"start {i} {t:.6f}\n".encode())


@app.task(name="noop")
async def noop(i: int) -> None:
    started(i)


STEPS = ("ptr", "claim", "w0", "w1", "reply", "fetched", "start")


def event_log(path: str) -> Callable[[str], None]:
    """``note(step)``: records the step's wall and thread-CPU time; the
    steps are written to ``path`` (``step wall cpu`` a line) at exit.  The
    worker-side half of every ``*_w3_steps.py``."""
    import atexit

    ev: list[tuple[str, float, float]] = []
    now, cpu = time.time, time.thread_time

    def note(name: str) -> None:
        ev.append((name, now(), cpu()))

    def dump() -> None:
        with open(path, "w") as f:
            f.writelines(f"{n} {t:.6f} {c:.6f}\n" for n, t, c in ev)

    atexit.register(dump)
    return note


def run_worker(module: str, instrument: Callable[[str], None]) -> None:
    """The worker process of a ``*_w3_steps.py``: ``instrument`` its steps
    (into the file ``W3_STEPS`` names), then ``dumbwaiter worker`` on the
    module's app."""
    instrument(os.environ["W3_STEPS"])
    from dumbwaiter.cli import main

    sys.argv = ["dumbwaiter", "worker", "--app", f"{module}:app", "-q", "default", "-c", "32"]
    main()


def _instrument(path: str) -> None:
    """Wrap the worker's pickup steps (in the worker process)."""
    from dumbwaiter.brokers.nats import broker as B
    from dumbwaiter.brokers.nats import puller as P
    from dumbwaiter.brokers.nats import wire as W

    note = event_log(path)
    handler = P.Puller._handler

    def _handler(self: Any, waits: Any) -> Any:
        on = handler(self, waits)

        def h(subject: bytes, reply: bytes, hdr: Any, data: bytes) -> None:
            if reply:
                note("ptr")
            on(subject, reply, hdr, data)

        return h

    P.Puller._handler = _handler  # type: ignore[method-assign]
    for name in ("_claim_send", "_claim_one"):
        if hasattr(B.NatsBroker, name):
            f = getattr(B.NatsBroker, name)

            def claim(self: Any, *a: Any, _f: Any = f) -> Any:
                note("claim")
                return _f(self, *a)

            setattr(B.NatsBroker, name, claim)
    write = W.Wire._write

    def _write(self: Any) -> None:
        note("w0")
        write(self)
        note("w1")

    W.Wire._write = _write  # type: ignore[method-assign]
    on_reply = W.Wire._on_reply

    def _on_reply(self: Any, *a: Any) -> None:
        note("reply")
        on_reply(self, *a)

    W.Wire._on_reply = _on_reply  # type: ignore[method-assign, assignment]
    fetch = B.NatsBroker.fetch

    async def _fetch(self: Any, *a: Any, **k: Any) -> Any:
        ds = await fetch(self, *a, **k)
        if ds:
            note("fetched")
        return ds

    B.NatsBroker.fetch = _fetch  # type: ignore[method-assign]


def worker() -> None:
    run_worker("nats_w3_steps", _instrument)


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.readlines()
    except FileNotFoundError:
        return []


def _spawn(done: str, steps: str, script: str = __file__) -> subprocess.Popen[bytes]:
    """``script --worker`` in a process of its own (benchmarks/ on its path)."""
    here = os.path.dirname(os.path.abspath(script))
    env = dict(os.environ, W3_DONE=done, W3_STEPS=steps)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    return subprocess.Popen([sys.executable, os.path.abspath(script), "--worker"], env=env)


async def _started(done: str, n: int, timeout: float) -> None:
    """Wait for ``n`` job starts in the worker's log (another process: polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(_lines(done)) >= n:
            return
        await asyncio.sleep(0.05)


async def produce(n: int, d: str) -> None:
    import nats

    from dumbwaiter.brokers.nats.names import stream_names

    nc = await nats.connect(URL.split("?")[0])
    for s in stream_names("w3steps"):
        try:
            await nc.jetstream().delete_stream(s)
        except Exception:
            pass
    await nc.close()
    calls = await w3(app, noop, n, d, __file__)
    report(calls, f"{d}/done", f"{d}/steps")


async def w3(
    app: dw.App, noop: Any, n: int, d: str, script: str, sync: bool = False
) -> dict[int, float]:
    """W3's producer side: ``script``'s worker started, a warm-up job, 2 s
    idle, then ``n`` jobs 5 ms apart; the time of each call, by job.
    ``sync``: the jobs enqueued with the sync call on the loop's thread, as
    the harness' SQLite adapter does."""
    await app.broker.open()
    done, steps = f"{d}/done", f"{d}/steps"
    w = _spawn(done, steps, script)
    calls: dict[int, float] = {}
    try:
        await noop.aenqueue(-1)
        await _started(done, 1, 60)
        await asyncio.sleep(2.0)
        base = time.time() + 0.01
        for k in range(n):
            delay = base + k * 0.005 - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            calls[k] = time.time()
            if sync:
                noop.enqueue(k)
            else:
                await noop.aenqueue(k)
        await _started(done, n + 1, 20)
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(30)
        await app.aclose()
    return calls


def report(
    calls: dict[int, float],
    done: str,
    steps: str,
    names: tuple[str, ...] = STEPS,
    needed: tuple[str, ...] = ("ptr", "claim", "w0", "reply", "fetched"),
    pairs: tuple[tuple[str, str], ...] = (("ptr", "w0"), ("w0", "w1"), ("reply", "fetched")),
) -> None:
    """The latency of each clean pickup, and the median time of each step
    ``names`` (in their order) after the producer's call; ``pairs``: spans
    printed with the worker thread's CPU beside their wall time."""
    starts = {int(i): float(t) for _, i, t in (line.split() for line in open(done))}
    lat = sorted((starts[k] - calls[k]) * 1000 for k in calls if k in starts)
    print(
        f"jobs {len(lat)}: p50 {statistics.median(lat):.3f} ms, p99 {lat[len(lat) * 99 // 100]:.3f}"
    )
    ev = sorted(((n, float(t), float(c)) for n, t, c in (ln.split() for ln in _lines(steps))),
                key=lambda e: e[1])  # fmt: skip
    per: dict[str, list[float]] = {s: [] for s in names}
    spans: dict[str, list[tuple[float, float]]] = {}
    for k, t0 in calls.items():
        if k not in starts or starts[k] > calls.get(k + 1, t0 + 1):
            continue  # overlapped with the next job: not a clean pickup
        seen: dict[str, tuple[float, float]] = {}
        for name, t, c in ev:
            if t < t0 or t > starts[k]:
                continue
            order = names.index(name)
            if name not in seen and all(s in seen for s in names[: max(order - 1, 0)]):
                seen[name] = (t, c)
        if not all(s in seen for s in needed):
            continue
        seen["start"] = (starts[k], 0.0)
        for s in names:
            per[s].append((seen[s][0] - t0) * 1000)
        for a, b in pairs:
            spans.setdefault(f"{a} -> {b}", []).append(
                ((seen[b][1] - seen[a][1]) * 1000, (seen[b][0] - seen[a][0]) * 1000)
            )
    for s in names:
        if per[s]:
            print(f"  {s:8s} {statistics.median(per[s]):.3f} ms  ({len(per[s])} jobs)")
    for span, xs in spans.items():
        c = statistics.median(x for x, _ in xs)
        w = statistics.median(y for _, y in xs)
        print(f"  {span:16s} worker CPU {c:.3f} ms, wall {w:.3f} ms")


def main(
    worker: Callable[[], None], produce: Callable[[int, str], Coroutine[Any, Any, None]]
) -> None:
    """A W3 step script's command line: ``--worker`` runs ``worker`` (the
    process ``w3`` spawns), else ``produce`` with ``--n`` jobs and a scratch
    directory for the two processes' files."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker()
    else:
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(produce(args.n, d))


if __name__ == "__main__":
    main(worker, produce)
