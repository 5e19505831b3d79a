"""Worker processes: does ``dumbwaiter worker --processes 2`` drain twice as
fast as one process, and where is the limit when it does not (issue 25.6)?

    .venv/bin/python benchmarks/scaling.py [--brokers redis postgres nats]
        [-n 20000] [-c 32] [--rounds 3] [--json out.json]

For each broker and round, four drains of ``-n`` no-op jobs, each on a fresh
namespace filled beforehand (not timed):

* ``dw x1`` / ``dw x2``: the real command, ``dumbwaiter worker --app
  benchmarks.scaling:app -q default -c C --processes 1`` (then ``2``: two
  processes of ``C`` slots each);
* ``bare x1`` / ``bare x2``: one or two processes of this script's bare
  worker, ``C`` jobs in flight per process, on the broker's own client:
  Redis: ``BLMOVE`` to a processing list, run, ``LREM`` (the reliable-queue
  loop) on redis-py's asyncio client; PostgreSQL: one transaction per job,
  ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1``, run, ``DELETE``,
  ``COMMIT`` (``synchronous_commit = off``, as dumbwaiter's worker sets it)
  on ``min(C, 10)`` psycopg connections (dumbwaiter's pool has at most 10);
  NATS: a durable JetStream pull consumer, ``fetch(C)``, run each, ``ack``
  (nats-py).

``--modes "dw x1" "dw x2" "dw x1 2c"`` adds one process with ``2C`` slots:
what a second process adds beyond more jobs in flight.  ``--base DIR`` adds
``base x1`` and ``base x2``: the same worker run from another checkout's
``DIR/src`` (an earlier commit), so a change is judged against it in one run.

The order alternates by round (``dw x1, dw x2, bare x1, bare x2``, then
reversed) because the machine is shared and its load moves; the figures are
medians over rounds (min-max) and each round's ratio x2 / x1.

A job writes one line to a plain file (one ``write(2)``, as the peers
harness' tasks do); the rate is ``n / (last line - first line)``.  Between
the first line and the n-th, the CPU time (``/proc``, user + system) of the
worker processes and of the broker's server (redis-server on 6379; the
postmaster and its backends; nats-server on 4222) is read and divided by
``n``: CPU per job.  ``ceiling`` is what the machine's cores could drain if
they did nothing else: ``cores / (worker + server CPU per job)``.

Each drain (reset, fill, drain) holds ``/tmp/dw-bench.lock``.  Namespaces:
Redis db 1 prefix ``dwscale`` (and ``dwscale:bare:*``), PostgreSQL schema
``dwscale`` (and table ``dwscale_bare``) in ``test``, NATS prefix
``dwscale`` (and stream ``dwscalebare``); all dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dumbwaiter as dw

ROOT = Path(__file__).resolve().parent.parent
TAG = "dwscale"
SERVERS = {
    "redis": "redis://127.0.0.1:6379/1",
    "postgres": "postgresql://127.0.0.1:5432/test",
    "nats": "nats://127.0.0.1:4222",
}
LOCK = "/tmp/dw-bench.lock"
DONE = Path(os.environ.get("DW_SCALING_DONE", f"/tmp/{TAG}-done.log"))
MODES = ("dw x1", "dw x2", "bare x1", "bare x2")
#: one process with the slots of two (``-c`` doubled): what x2 adds beyond
#: more jobs in flight (``--modes "dw x1" "dw x2" "dw x1 2c"``)
EXTRA_MODES = ("dw x1 2c",)
#: the worker of another checkout (``--base``)
BASE_MODES = ("base x1", "base x2")
PG_CONNECTIONS = 10


def dw_url(kind: str) -> str:
    if kind == "postgres":
        return f"{SERVERS[kind]}?schema={TAG}&migrate=auto"
    return f"{SERVERS[kind]}?prefix={TAG}"


# -- the worker's app (``--app benchmarks.scaling:app``; the URL from the env) --

app = dw.App(os.environ.get("DW_SCALING_URL", dw_url("redis")))
_fd: list[int] = []


def _line(i: int) -> None:
    if not _fd:
        _fd.append(os.open(DONE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    t = time.time()
    os.write(_fd[0], f"{i} {t:.6f} {os.getpid()}\n".encode())


@app.task(name="noop")
async def noop(i: int) -> None:
    _line(i)


# -- the bare workers (``--bare-worker KIND``, one process each) ---------------


async def _bare_redis(c: int) -> None:
    import redis.asyncio as aredis

    r = aredis.Redis.from_url(SERVERS["redis"], max_connections=c + 1, decode_responses=True)
    queue, processing = f"{TAG}:bare:q", f"{TAG}:bare:p:{os.getpid()}"

    async def slot() -> None:
        while True:
            v = await r.blmove(queue, processing, 1, "RIGHT", "LEFT")
            if v is None:
                continue
            _line(int(v))  # the job
            await r.lrem(processing, 1, str(v))

    await asyncio.gather(*(slot() for _ in range(c)))


async def _bare_postgres(c: int) -> None:
    import psycopg

    async def slot() -> None:
        conn = await psycopg.AsyncConnection.connect(SERVERS["postgres"])
        await conn.execute("SET synchronous_commit = off")
        await conn.commit()
        while True:
            async with conn.transaction():
                cur = await conn.execute(
                    f"SELECT id, body FROM {TAG}_bare ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
                )
                row = await cur.fetchone()
                if row is not None:
                    _line(int(row[1]))
                    await conn.execute(f"DELETE FROM {TAG}_bare WHERE id = %s", (row[0],))
            if row is None:
                await asyncio.sleep(0.01)  # an empty queue: poll (not timed: the drain is over)

    await asyncio.gather(*(slot() for _ in range(min(c, PG_CONNECTIONS))))


async def _bare_nats(c: int) -> None:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(SERVERS["nats"])
    js = nc.jetstream()
    sub = await js.pull_subscribe(f"{TAG}bare.q", durable="w", stream=f"{TAG}bare")

    async def run(msg: Any) -> None:
        _line(int(msg.data))
        await msg.ack()

    while True:
        try:
            msgs = await sub.fetch(c, timeout=1)
        except NatsTimeout:
            continue
        await asyncio.gather(*(run(m) for m in msgs))


BARE = {"redis": _bare_redis, "postgres": _bare_postgres, "nats": _bare_nats}


# -- namespaces ------------------------------------------------------------------


def reset(kind: str) -> None:
    """Drop this script's namespace on ``kind`` (dumbwaiter's and the bare one)."""
    DONE.unlink(missing_ok=True)
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(SERVERS[kind])
        try:
            for pattern in (f"{{dw:{TAG}}}:*", f"{TAG}:bare:*"):
                keys = list(client.scan_iter(match=pattern, count=5000))
                for i in range(0, len(keys), 5000):
                    client.unlink(*keys[i : i + 5000])
        finally:
            client.close()
    elif kind == "postgres":
        import psycopg

        with psycopg.connect(SERVERS[kind], autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {TAG} CASCADE")
            c.execute(f"DROP TABLE IF EXISTS {TAG}_bare")
    else:
        from dumbwaiter.brokers.nats.names import stream_names

        async def streams() -> None:
            import nats
            from nats.js.errors import NotFoundError

            nc = await nats.connect(SERVERS[kind])
            try:
                for s in (*stream_names(TAG), f"{TAG}bare"):
                    with contextlib.suppress(NotFoundError):
                        await nc.jetstream().delete_stream(s)
            finally:
                await nc.close()

        asyncio.run(streams())


async def _fill_dw(kind: str, n: int) -> None:
    a = dw.App(dw_url(kind))
    task = a.task(name="noop")(noop.fn)
    try:
        for start in range(0, n, 1000):
            await task.aenqueue_many(range(start, min(n, start + 1000)))
    finally:
        await a.aclose()


async def _fill_bare(kind: str, n: int) -> None:
    if kind == "redis":
        import redis.asyncio as aredis

        r = aredis.Redis.from_url(SERVERS[kind])
        try:
            for start in range(0, n, 1000):
                await r.lpush(f"{TAG}:bare:q", *range(start, min(n, start + 1000)))
        finally:
            await r.aclose()
    elif kind == "postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(SERVERS[kind], autocommit=True) as c:
            await c.execute(f"CREATE TABLE {TAG}_bare (id bigserial PRIMARY KEY, body text)")
            async with c.cursor().copy(f"COPY {TAG}_bare (body) FROM STDIN") as copy:
                for i in range(n):
                    await copy.write_row((str(i),))
    else:
        import nats
        from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

        nc = await nats.connect(SERVERS[kind])
        js = nc.jetstream()
        try:
            stream = f"{TAG}bare"
            await js.add_stream(
                StreamConfig(
                    name=stream, subjects=[f"{stream}.q"], retention=RetentionPolicy.WORK_QUEUE
                )
            )
            await js.add_consumer(
                stream, ConsumerConfig(durable_name="w", ack_wait=60, max_ack_pending=-1)
            )
            for start in range(0, n, 1000):
                await asyncio.gather(
                    *(
                        js.publish(f"{stream}.q", str(i).encode())
                        for i in range(start, start + 1000)
                    )
                )
        finally:
            await nc.close()


# -- CPU from /proc ------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _cpu(pid: int, children_done: bool = False) -> float:
    """CPU seconds of ``pid`` (with its reaped children's when asked)."""
    try:
        f = _stat(pid)
    except OSError:
        return 0.0
    ticks = int(f[11]) + int(f[12])
    if children_done:
        ticks += int(f[13]) + int(f[14])
    return ticks / _TICK


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if int(_stat(int(d))[1]) == pid:
                    out.append(int(d))
    return out


def _find(words: tuple[str, ...]) -> int | None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                if all(w in cmd for w in words):
                    return int(d)
    return None


def server_cpu(kind: str) -> float:
    """CPU seconds the broker's server has used so far (a server shared with
    the machine's other users: their work on it counts too)."""
    if kind == "redis":
        pid = _find(("redis-server", ":6379"))
        return _cpu(pid) if pid else 0.0
    if kind == "nats":
        pid = _find(("nats-server", "4222"))
        return _cpu(pid) if pid else 0.0
    pid = _find(("postgres", "-D /var/lib/postgresql"))
    if pid is None:
        return 0.0
    # the postmaster reaps its backends: their CPU is in its cutime/cstime
    return _cpu(pid, children_done=True) + sum(_cpu(c) for c in _children(pid))


# -- one drain -------------------------------------------------------------------


@contextlib.contextmanager
def bench_lock() -> Iterator[None]:
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Tail:
    """Counts the completion file's lines, reading only what was appended,
    and the processes that wrote them (until ``want`` have)."""

    def __init__(self, want: int) -> None:
        self.f: Any = None
        self.lines = 0
        self.want = want
        self.pids: set[bytes] = set()
        self.rest = b""

    def count(self) -> int:
        if self.f is None:
            try:
                self.f = open(DONE, "rb")  # closed by close()
            except FileNotFoundError:
                return 0
        chunk = self.f.read()
        self.lines += chunk.count(b"\n")
        if len(self.pids) < self.want:
            *whole, self.rest = (self.rest + chunk).split(b"\n")
            self.pids.update(line.rsplit(b" ", 1)[1] for line in whole)
        return self.lines

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def machine() -> tuple[float, float]:
    """The machine's busy and total CPU seconds so far (``/proc/stat``)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f) - idle) / _TICK, sum(f) / _TICK


def drain(kind: str, mode: str, n: int, c: int, base: Path | None = None) -> dict[str, float]:
    """One drain of ``n`` jobs in ``mode``: rate and CPU per job (``base``
    modes run the worker from ``base/src``)."""
    procs = 2 if mode.endswith("x2") else 1
    if mode.endswith("2c"):
        c *= 2
    ours = mode.startswith(("dw", "base"))
    src = (base if mode.startswith("base") and base is not None else ROOT) / "src"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]),
        DW_SCALING_URL=dw_url(kind),
        DW_SCALING_DONE=str(DONE),
    )
    with bench_lock():
        reset(kind)
        if ours:
            asyncio.run(_fill_dw(kind, n))
        else:
            asyncio.run(_fill_bare(kind, n))
        # the server's own background (other users of the shared server) in
        # the half second before the drain: subtracted from its CPU in the drain
        b0, tb = server_cpu(kind), time.monotonic()
        time.sleep(0.5)
        background = (server_cpu(kind) - b0) / (time.monotonic() - tb)
        if ours:
            cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", "benchmarks.scaling:app"]
            cmd += ["-q", "default", "-c", str(c), "--processes", str(procs)]
            cmd += ["--log-level", "WARNING"]
            top = [subprocess.Popen(cmd, env=env, cwd=ROOT)]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--bare-worker", kind]
            cmd += ["-c", str(c)]
            top = [subprocess.Popen(cmd, env=env, cwd=ROOT) for _ in range(procs)]
        tail = _Tail(procs)
        try:
            deadline = time.monotonic() + 300
            # the window opens when every process has run a job (a process
            # still importing must not count against the rate)
            while tail.count() < n and len(tail.pids) < procs:
                if any(p.poll() is not None for p in top) or time.monotonic() > deadline:
                    raise SystemExit(f"{kind} {mode}: the worker exited or never started")
                time.sleep(0.002)
            if len(tail.pids) < procs:
                raise SystemExit(f"{kind} {mode}: one process ran all {n} jobs: raise -n")
            workers = [w for p in top for w in (_children(p.pid) or [p.pid])]
            w0 = {w: _cpu(w) for w in workers}
            s0, m0, t0, done0 = server_cpu(kind), machine(), time.monotonic(), tail.lines
            load = os.getloadavg()[0]
            while tail.count() < n:
                if any(p.poll() is not None for p in top) or time.monotonic() > deadline:
                    raise SystemExit(f"{kind} {mode}: {tail.lines} of {n} jobs ran")
                time.sleep(0.005)
            w1 = {w: _cpu(w) for w in workers}
            s1, m1, t1, done1 = server_cpu(kind), machine(), time.monotonic(), tail.lines
        finally:
            tail.close()
            for p in top:
                p.send_signal(signal.SIGTERM)
            for p in top:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    rows = [line.split() for line in DONE.read_text().splitlines()]
    first: dict[str, float] = {}
    for _, t, pid in rows:
        first[pid] = min(first.get(pid, float(t)), float(t))
    opened = max(first.values())  # every process running jobs from here
    ts = sorted(float(t) for _, t, _ in rows if float(t) >= opened)
    per_pid = Counter(pid for _, _, pid in rows)
    jobs = max(1, done1 - done0)  # the jobs run in the CPU window
    worker_us = sum(w1[w] - w0[w] for w in workers) / jobs * 1e6
    server_us = max(0.0, (s1 - s0) - background * (t1 - t0)) / jobs * 1e6
    busy, total = m1[0] - m0[0], m1[1] - m0[1]
    return {
        "rate": (len(ts) - 1) / (ts[-1] - ts[0]),
        "unique": float(len({i for i, _, _ in rows})),
        "largest_share": max(per_pid.values()) / len(rows),
        "worker_us_per_job": worker_us,
        "server_us_per_job": server_us,
        "server_background_cpu": background,
        "ceiling": (os.cpu_count() or 1) * 1e6 / (worker_us + server_us),
        "machine_busy": busy / total if total else 0.0,
        "load": load,
    }


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"


def report(results: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    print(
        "\n| broker | mode | jobs/s | worker CPU us/job | server CPU us/job "
        "| ceiling jobs/s | machine busy % | load |\n|---|---|--:|--:|--:|--:|--:|--:|"
    )
    for kind, modes in results.items():
        for mode, runs in modes.items():
            col = {k: [r[k] for r in runs] for k in runs[0]}
            print(
                f"| {kind} | {mode} | {_med(col['rate'])} | {_med(col['worker_us_per_job'])} "
                f"| {_med(col['server_us_per_job'])} | {_med(col['ceiling'])} "
                f"| {_med([100 * b for b in col['machine_busy']])} "
                f"| {statistics.median(col['load']):.1f} |"
            )
    print(
        "\n| broker | dw x2 / x1, each round | median | base x2 / x1, each round | median "
        "| bare x2 / x1, each round | median |"
    )
    print("|---|---|--:|---|--:|---|--:|")
    for kind, modes in results.items():
        cells = []
        for who in ("dw", "base", "bare"):
            if f"{who} x1" not in modes or f"{who} x2" not in modes:
                cells += ["", ""]
                continue
            ratios = [
                b["rate"] / a["rate"]
                for a, b in zip(modes[f"{who} x1"], modes[f"{who} x2"], strict=True)
            ]
            cells += [", ".join(f"{r:.2f}" for r in ratios), f"{statistics.median(ratios):.2f}"]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    p.add_argument("-n", type=int, default=20_000)
    p.add_argument("-c", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--modes", nargs="+", default=list(MODES), choices=[*MODES, *EXTRA_MODES, *BASE_MODES]
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--base", type=Path, help="a checkout whose src/ the base modes run")
    p.add_argument("--bare-worker", choices=list(SERVERS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.base is None and set(args.modes) & set(BASE_MODES):
        p.error("the base modes need --base DIR")
    if args.base is not None and not set(args.modes) & set(BASE_MODES):
        args.modes += list(BASE_MODES)
    if args.bare_worker:
        # every job's line is written with write(2): nothing is left to flush
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(BARE[args.bare_worker](args.c))
        return
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        k: {m: [] for m in args.modes} for k in args.brokers
    }
    try:
        for rnd in range(args.rounds):
            for kind in args.brokers:
                order = list(args.modes) if rnd % 2 == 0 else list(reversed(args.modes))
                for mode in order:
                    r = drain(kind, mode, args.n, args.c, args.base)
                    results[kind][mode].append(r)
                    print(
                        f"round {rnd + 1} {kind} {mode}: "
                        + ", ".join(f"{k} {v:,.1f}" for k, v in r.items()),
                        flush=True,
                    )
    finally:
        for kind in args.brokers:
            reset(kind)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
