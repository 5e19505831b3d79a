"""Where a W3 pickup's time goes on Kafka, next to the bare aiokafka client
and its floor, in one run on one server.

W3 as the peers harness runs it (one worker process, a warm-up job, 2 s
idle, then N jobs 5 ms apart; the latency of a job is its handler's start
less the producer's call), for three pairs of producer and worker, in a
rotating order each repetition:

* ``bare``: ``send_and_wait`` one at a time (acks=all, linger 0); the worker
  a ``getmany`` loop that starts each record's task and commits each batch
  (the harness' ``aiokafka-bare``);
* ``floor``: the record written first (``SET NX`` of a 480-byte record in
  Redis, then the same ``send_and_wait``, as ``aiokafka-redis-floor``), and a
  worker that makes one checked state-store write per batch before it
  starts any task of it: one Lua call that, for each record read, checks
  that its record is there and not leased, and leases it (what keeps a
  cancelled or duplicated job from running).  What is physically left
  when a job may run only after its record says so;
* ``ours``: ``aenqueue`` and ``dumbwaiter worker -c 32`` on the Kafka
  broker (state store: Redis db 1, a prefix of the run's own).

All three consumers read at ``fetch_max_wait_ms=100`` (dumbwaiter's default
``fetch_wait=0.1``): tansu 0.6 answers a waiting fetch only after it, so
the pickup follows it.  Each worker stamps, by wrapping functions from
outside (in the worker process only; nothing in ``src`` changes), when a
fetch answer with records was read off its connection (aiokafka's
fetcher, ``arr``); ``ours`` also stamps each job's steps: the copy read out
of ``getmany`` (``read``), the judge's state-store update (``judge0`` /
``judge1``), the fetch's return (``fetched``), the handler's start
(``start``); its producer stamps the copy's send (``send0``: the record is
written) and its acknowledgement (``send1``).  Printed: p50 / p99 of each,
and for ``ours`` the median of each step in ms after the producer's call.

    PYTHONPATH=src .venv/bin/python benchmarks/kafka_w3_steps.py [--n 400] [--reps 2] \
        [--only bare,floor,ours]

``W3_DEEP=1`` also stamps each Redis script call and offset commit of our
worker, and prints the most common sequence of them between a job's judge
and its start.

tansu is started here (as ``kafka_bench.py``) unless ``DW_BENCH_KAFKA``
names a cluster; Redis at ``DW_BENCH_REDIS`` (default db 1 of the local one).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import itertools
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import quote

REDIS = os.environ.get("DW_BENCH_REDIS", "redis://127.0.0.1:6379/1")
FETCH_WAIT_MS = 100
RECORD = b"r" * 480
VARIANTS = ("bare", "floor", "ours")
SCRIPT = os.path.abspath(__file__)
HERE = os.path.dirname(SCRIPT)


def url_of(servers: str, run: str) -> str:
    state = quote(f"{REDIS}?prefix=w3k{run}", safe="")
    return f"kafka://{servers}?prefix=w3k{run}&state={state}"


# -- the worker processes -----------------------------------------------------------


def started(i: int) -> None:
    """The start of job ``i``, a line in ``W3_DONE``."""
    t = time.time()
    fd = os.open(os.environ["W3_DONE"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, f"start {i} {t:.6f}\n".encode())
    os.close(fd)


def stamp_fetches(note: Callable[[str], None]) -> None:
    """``arr``: a fetch answer with records was read (aiokafka's fetcher,
    wrapped in this measuring process only)."""
    from aiokafka.consumer.fetcher import Fetcher

    proc = Fetcher._proc_fetch_request

    async def _proc(self: Any, *a: Any, **k: Any) -> Any:
        got = await proc(self, *a, **k)
        if got:
            note("arr")
        return got

    Fetcher._proc_fetch_request = _proc  # type: ignore[method-assign]


async def bare_worker(floor: bool) -> None:
    from aiokafka import AIOKafkaConsumer

    run = os.environ["W3_RUN"]
    c = AIOKafkaConsumer(
        f"w3b{run}",
        bootstrap_servers=os.environ["DW_BENCH_KAFKA"],
        group_id=f"w3b{run}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    redis: Any = None
    claim: Any = None
    if floor:
        import redis.asyncio as aioredis

        # the claim floor adapter's checked write, from the module the
        # harness' Kafka adapters share
        sys.path.insert(0, os.path.join(HERE, "peers"))
        from kafka_common import CLAIM

        redis = aioredis.Redis.from_url(REDIS)
        claim = redis.register_script(CLAIM)
    await c.start()
    try:
        while True:
            batch = await c.getmany(timeout_ms=1000, max_records=500)
            recs = [r for rs in batch.values() for r in rs]
            ok = [1] * len(recs)
            if floor and recs:
                keys = [f"f{x}{run}:{r.key.decode()}" for r in recs for x in "rl"]
                ok = await claim(keys=keys, args=["w"])
            for r, taken in zip(recs, ok, strict=True):
                if taken:
                    started(int(r.value))
            if batch:
                await c.commit()
    finally:
        await c.stop()


def ours_worker(note: Callable[[str], None]) -> None:
    """``dumbwaiter worker`` on this module's app, its steps stamped."""
    from dumbwaiter.brokers.kafka import broker as B
    from dumbwaiter.brokers.kafka import jobs as J
    from dumbwaiter.brokers.kafka import transport as T

    copy_of = T.copy_of

    def _copy_of(rec: Any) -> Any:
        c = copy_of(rec)
        note(f"read:{c.header('dw-id')}")
        return c

    T.copy_of = _copy_of
    judge = J.judge

    async def _judge(b: Any, copies: Any, *a: Any, **k: Any) -> Any:
        for c in copies:
            note(f"judge0:{c.header('dw-id')}")
        got, waiting = await judge(b, copies, *a, **k)
        for d, _ in got:
            note(f"judge1:{d.id}")
        return got, waiting

    J.judge = _judge
    fetch = B.KafkaBroker.fetch

    async def _fetch(self: Any, *a: Any, **k: Any) -> Any:
        ds = await fetch(self, *a, **k)
        for d in ds:
            note(f"fetched:{d.id}")
        return ds

    B.KafkaBroker.fetch = _fetch  # type: ignore[method-assign]
    if os.environ.get("W3_DEEP"):
        deep(note)
    from dumbwaiter.cli import main

    sys.argv = ["dumbwaiter", "worker", "--app", "kafka_w3_steps:app", "-q", "default", "-c", "32",
                "--log-level", "WARNING"]  # fmt: skip
    main()


def deep(note: Callable[[str], None]) -> None:
    """``W3_DEEP=1``: each Redis script call and Kafka commit, as events
    (printed as the median of each between a judge's start and its job's
    start)."""
    from dumbwaiter.brokers.kafka import transport as T
    from dumbwaiter.brokers.redis.connection import Connection

    run = Connection.run

    async def _run(self: Any, script: Any, args: Any) -> Any:
        note(f"{script.name}0")
        try:
            return await run(self, script, args)
        finally:
            note(f"{script.name}1")

    Connection.run = _run  # type: ignore[method-assign]
    commit = T.Reader.commit

    async def _commit(self: Any, only: Any = None) -> None:
        note("commit0")
        await commit(self, only)
        note("commit1")

    T.Reader.commit = _commit  # type: ignore[method-assign]


def worker(variant: str) -> None:
    from nats_w3_steps import event_log

    note = event_log(os.environ["W3_STEPS"])
    stamp_fetches(note)
    if variant == "ours":
        ours_worker(note)
    else:
        signal.signal(signal.SIGTERM, _interrupt)  # the producer stops every worker so
        try:
            asyncio.run(bare_worker(variant == "floor"))
        except KeyboardInterrupt:
            pass


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if os.environ.get("W3_RUN") and os.environ.get("DW_BENCH_KAFKA"):
    import dumbwaiter as dw

    app = dw.App(url_of(os.environ["DW_BENCH_KAFKA"], os.environ["W3_RUN"]))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        started(i)


# -- the producer ---------------------------------------------------------------------


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.readlines()
    except FileNotFoundError:
        return []


async def _started(done: str, n: int, timeout: float) -> None:
    """Until ``n`` job starts are in the worker's log (another process:
    polled, as the harness polls its completion log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(_lines(done)) >= n:
            return
        await asyncio.sleep(0.02)


class Producer:
    """One variant's producer: ``call(k)`` enqueues job ``k``."""

    def __init__(self, variant: str, servers: str, run: str) -> None:
        self.variant, self.servers, self.run = variant, servers, run
        self.ids: dict[int, str] = {}
        self.sends: dict[int, tuple[float, float]] = {}
        self._k = 0
        self._p: Any = None
        self._redis: Any = None
        self._app: Any = None

    async def open(self) -> None:
        if self.variant == "ours":
            import dumbwaiter as dw
            from dumbwaiter.brokers.kafka.broker import KafkaBroker

            self._app = dw.App(url_of(self.servers, self.run))
            self._noop = self._app.task(name="noop")(_never)
            send = KafkaBroker.send
            me = self

            async def _send(b: Any, items: Any) -> None:
                t0 = time.time()
                await send(b, items)
                me.sends[me._k] = (t0, time.time())

            KafkaBroker.send = _send  # type: ignore[method-assign]
            await self._app.broker.open()
            return
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.servers)
        await admin.start()
        await admin.create_topics([NewTopic(f"w3b{self.run}", 3, 1)])
        await admin.close()
        self._p = AIOKafkaProducer(bootstrap_servers=self.servers, acks="all", linger_ms=0)
        await self._p.start()
        if self.variant == "floor":
            import redis.asyncio as aioredis

            self._redis = aioredis.Redis.from_url(REDIS)

    async def call(self, k: int) -> None:
        self._k = k
        if self._app is not None:
            self.ids[k] = (await self._noop.aenqueue(k)).id
            return
        key = str(k).encode()
        if self._redis is not None:
            await self._redis.set(f"fr{self.run}:{k}", RECORD, nx=True)
        await self._p.send_and_wait(f"w3b{self.run}", str(k).encode(), key=key)

    async def close(self) -> None:
        if self._app is not None:
            await self._app.aclose()
        if self._p is not None:
            await self._p.stop()
        if self._redis is not None:
            await self._redis.aclose()


async def _never(i: int) -> None:  # the producer's handle on the task; runs in the worker
    raise AssertionError("run by the worker only")


async def w3(variant: str, servers: str, n: int, d: str) -> dict[str, Any]:
    """One W3 run of ``variant``: its latencies and stamps."""
    run = secrets.token_hex(4)
    done, steps = f"{d}/{variant}{run}.done", f"{d}/{variant}{run}.steps"
    p = Producer(variant, servers, run)
    await p.open()
    env = dict(os.environ, W3_DONE=done, W3_STEPS=steps, W3_RUN=run, DW_BENCH_KAFKA=servers)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (env.get("PYTHONPATH"), HERE) if x)
    w = subprocess.Popen([sys.executable, SCRIPT, "--worker", variant], env=env)  # noqa: ASYNC220
    calls: dict[int, float] = {}
    try:
        await p.call(-1)
        await _started(done, 1, 60)
        await asyncio.sleep(2.0)
        base = time.time() + 0.01
        for k in range(n):
            delay = base + k * 0.005 - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            calls[k] = time.time()
            await p.call(k)
        await _started(done, n + 1, 30)
    finally:
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
        await p.close()
    starts = {int(i): float(t) for _, i, t in (ln.split() for ln in _lines(done))}
    ev = [(name, float(t)) for name, t, _ in (ln.split() for ln in _lines(steps))]
    return {"calls": calls, "starts": starts, "ids": p.ids, "sends": p.sends, "ev": ev}


def pct(xs: list[float], q: int) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, len(xs) * q // 100)]


def summary(variant: str, r: dict[str, Any]) -> dict[str, float]:
    calls, starts = r["calls"], r["starts"]
    lat = [(starts[k] - calls[k]) * 1000 for k in calls if k in starts]
    arrs = sorted(t for name, t in r["ev"] if name == "arr")

    def arrival(t: float) -> float | None:
        i = bisect.bisect_right(arrs, t)
        return arrs[i - 1] if i else None

    # the answer that brought job k: the last one read before it was
    # (bare / floor: before it started; ours: before its copy was read)
    steps: dict[str, dict[str, float]] = {}
    for name, t in r["ev"]:
        if ":" in name:
            step, jid = name.split(":", 1)
            steps.setdefault(jid, {}).setdefault(step, t)
    out = {"p50": statistics.median(lat), "p99": pct(lat, 99), "missing": len(calls) - len(lat)}
    to_arr, arr_start = [], []
    per: dict[str, list[float]] = {}
    for k, t0 in calls.items():
        if k not in starts:
            continue
        s = steps.get(r["ids"].get(k, ""), {})
        a = arrival(s["read"] if "read" in s else starts[k])
        if a is None or a < t0:
            continue
        to_arr.append((a - t0) * 1000)
        arr_start.append((starts[k] - a) * 1000)
        if variant == "ours" and all(x in s for x in ("read", "judge0", "judge1", "fetched")):
            sent = r["sends"].get(k)
            marks = {"arr": a, **s, "start": starts[k]}
            if sent:
                marks = {"send0": sent[0], "send1": sent[1], **marks}
            last = t0
            for name, t in marks.items():  # each step after the one before it
                per.setdefault(f"+{name}", []).append((t - last) * 1000)
                last = t
    if variant == "ours":
        _deep(r, steps)
    out["call->arr"] = statistics.median(to_arr)
    out["arr->start"] = statistics.median(arr_start)
    out["arr->start p99"] = pct(arr_start, 99)
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrs) if b - a < 1.0]
    out["cycle"] = statistics.median(gaps) if gaps else 0.0
    for name, xs in per.items():
        out[name] = statistics.median(xs)
    return out


def _deep(r: dict[str, Any], steps: dict[str, dict[str, float]]) -> None:
    """With ``W3_DEEP=1``: the events between a job's judge and its start,
    the most common sequence, each as its median ms after the judge began."""
    plain = sorted((t, name) for name, t in r["ev"] if ":" not in name and name != "arr")
    if not plain:
        return
    seqs: collections.Counter[tuple[str, ...]] = collections.Counter()
    times: dict[tuple[str, ...], list[list[float]]] = {}
    for k, jid in r["ids"].items():
        s = steps.get(jid, {})
        if "judge0" not in s or k not in r["starts"]:
            continue
        t0, t1 = s["judge0"], r["starts"][k]
        got = [(name, (t - t0) * 1000) for t, name in plain if t0 <= t <= t1]
        seq = tuple(n for n, _ in got)
        seqs[seq] += 1
        times.setdefault(seq, []).append([x for _, x in got] + [(t1 - t0) * 1000])
    for seq, count in seqs.most_common(2):
        cols = list(zip(*times[seq], strict=True))
        names = (*seq, "start")
        shown = [f"{n} {statistics.median(c):.2f}" for n, c in zip(names, cols, strict=True)]
        print(f"    deep ({count} jobs): " + ", ".join(shown))


def running_tansu() -> AbstractContextManager[str]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kafka_bench import running_tansu as running

    return running()


async def produce(n: int, reps: int, variants: list[str]) -> None:
    with running_tansu() as servers:
        with tempfile.TemporaryDirectory() as d:
            for rep in range(reps):
                order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
                for v in order:
                    s = summary(v, await w3(v, servers, n, d))
                    head = (
                        f"rep {rep + 1} {v:5s}: p50 {s.pop('p50'):.2f} ms  p99 {s.pop('p99'):.2f}"
                        f"  (missing {s.pop('missing')})"
                    )
                    print(head)
                    print("    " + "  ".join(f"{k} {x:.2f}" for k, x in s.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--worker", choices=VARIANTS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
    else:
        asyncio.run(produce(args.n, args.reps, args.only.split(",")))


if __name__ == "__main__":
    main()
