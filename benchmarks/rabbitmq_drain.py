"""W1's drain on RabbitMQ, alone: one ``dumbwaiter worker`` process drains N
no-op jobs; prints the rate and the worker's CPU per job, by thread.

The harness' W1 (``benchmarks/run.sh``) measures the same drain next to the
peers; this script measures only it, quickly (a bulk enqueue instead of
10,000 one-at-a-time ones), so a change to the worker's path can be tried
in minutes, and profiled:

    .venv/bin/python benchmarks/rabbitmq_drain.py [-n 10000] [-c 32] [--reps 3]
    .venv/bin/python benchmarks/rabbitmq_drain.py --profile /tmp/drain.txt   # py-spy, raw

The worker is the real command (``dumbwaiter worker --app
benchmarks.rabbitmq_drain:app -q default -c 32``, uvloop unless
``DUMBWAITER_LOOP`` says otherwise), the jobs' records in a SQLite state
store in ``/tmp``, the queues under the prefix ``dwdrain`` (deleted before
each repetition).  The task writes one line per job to a file, as the
harness' tasks do; the rate is the span between the first and the last
line.  CPU per job is each thread's CPU time (``/proc``) between the first
job's line and the last one's, divided by N: ``MainThread`` is the event
loop, ``dumbwaiter-sqli`` the state store's thread.  ``--profile`` attaches
``py-spy record --threads --nonblocking`` for the same span and writes
collapsed stacks; ``--top`` prints the heaviest frames of such a file.

Run it under the benchmarks' flock when comparing commits, alternating them,
each with its own copy of this script (``cd EXPORT && python
benchmarks/rabbitmq_drain.py``): the worker runs the checkout the script is
in, whatever ``PYTHONPATH`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import dumbwaiter as dw

PREFIX = os.environ.get("DW_DRAIN_PREFIX", "dwdrain")
STATE = Path(os.environ.get("DW_DRAIN_STATE", f"/tmp/{PREFIX}-state.db"))
DONE = Path(os.environ.get("DW_DRAIN_DONE", f"/tmp/{PREFIX}-done.log"))
AMQP = os.environ.get("DW_DRAIN_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
URL = (
    f"{AMQP}?prefix={PREFIX}&delays={PREFIX}.delay"
    f"&state={quote(f'sqlite:///{STATE}', safe='')}"
    + os.environ.get("DW_DRAIN_OPTIONS", "")  # more options, e.g. "&prefetch=256"
)

app = dw.App(URL)
_fd: list[int] = []


@app.task(name="noop")
async def noop(i: int) -> None:
    if not _fd:
        _fd.append(os.open(DONE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    t = time.time()
    os.write(_fd[0], f"noop {i} {t:.6f} {t:.6f} {os.getpid()}\n".encode())


async def _reset() -> None:
    import aiormq

    from dumbwaiter.brokers.rabbitmq import announce, topology

    names = topology.Topology(PREFIX, f"{PREFIX}.delay")
    conn = await aiormq.connect(AMQP)
    try:
        ch = await conn.channel()
        for q in [
            *names.lanes("default"),
            names.dlq("default"),
            *(names.level_queue(n) for n in range(topology.LEVELS)),
        ]:
            await ch.queue_delete(q)
        for x in [names.dlx, names.events, *(names.level(n) for n in range(-1, topology.LEVELS))]:
            await ch.exchange_delete(x)
        # the state store is new each time: forget the old one's identity
        await ch.queue_delete(announce.name(PREFIX))
        await ch.exchange_delete(announce.name(PREFIX))
    finally:
        await conn.close()


def _reset_all() -> None:
    asyncio.run(_reset())
    for suffix in ("", "-wal", "-shm"):
        Path(f"{STATE}{suffix}").unlink(missing_ok=True)
    DONE.unlink(missing_ok=True)


async def _fill(n: int) -> None:
    a = dw.App(URL)
    task = a.task(name="noop")(noop.fn)
    try:
        for start in range(0, n, 1000):
            await task.aenqueue_many(range(start, min(n, start + 1000)))
    finally:
        await a.aclose()


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid``, by name (same names summed)."""
    out: Counter[str] = Counter()
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out["MainThread" if tid == str(pid) else name] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


def _lines() -> int:
    try:
        with DONE.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def one(
    n: int,
    concurrency: int,
    profile: str | None,
    gil: bool = False,
    app_ref: str = "benchmarks.rabbitmq_drain:app",
    reset: Callable[[], None] | None = None,
    fill: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, float]:
    """One drain of ``n`` jobs by a worker on ``app_ref`` (RabbitMQ's by
    default; ``benchmarks/nats_drain.py`` passes its own app, ``reset`` and
    ``fill``)."""
    (reset or _reset_all)()
    asyncio.run((fill or _fill)(n))
    here = Path(__file__).resolve().parent.parent
    # this checkout's sources first (a snapshot of another commit measures that one)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here / "src"), str(here)]))
    cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app"]
    cmd += [app_ref, "-q", "default", "-c", str(concurrency)]
    cmd += ["--log-level", "WARNING"]
    worker = subprocess.Popen(cmd, env=env, cwd=here)
    spy = None
    try:
        while _lines() == 0:
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode})")
            time.sleep(0.005)
        cpu0 = _threads(worker.pid)
        if profile:
            spy_bin = str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen(
                [spy_bin, "record", "--pid", str(worker.pid), "--threads", "--nonblocking"]
                + ["--format", "raw", "-r", "400", "-o", profile]
                + (["--gil"] if gil else []),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        while _lines() < n:
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited ({worker.returncode})")
            time.sleep(0.01)
        cpu1 = _threads(worker.pid)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    lines = DONE.read_text().splitlines()
    ts = [float(line.split()[2]) for line in lines]
    span = max(ts) - min(ts)
    out = {"rate": len(lines) / span, "unique": float(len({line.split()[1] for line in lines}))}
    for name, secs in cpu1.items():
        used = secs - cpu0.get(name, 0.0)
        if used > 0:
            out[f"us/job {name}"] = used / len(lines) * 1e6
    return out


def top(path: str, k: int = 40) -> None:
    """The heaviest frames of a py-spy raw file: self and inclusive samples."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        c = int(count)
        frames = stack.split(";")
        total += c
        own[frames[-1]] += c
        for f in set(frames[1:]):
            incl[f] += c
    print(f"{total} samples")
    print("-- self")
    for f, c in own.most_common(k):
        print(f"{100 * c / total:5.1f}%  {f}")
    print("-- inclusive")
    for f, c in incl.most_common(k):
        print(f"{100 * c / total:5.1f}%  {f}")


def main_for(
    app_ref: str, reset: Callable[[], None], fill: Callable[[int], Awaitable[None]]
) -> None:
    """The command line of a drain script for another broker
    (``benchmarks/nats_drain.py``, ``sqlite_drain.py``): ``-n``, ``-c``,
    ``--reps``, ``--profile``, each repetition on a namespace ``reset`` made
    empty and ``fill`` filled."""
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=10_000)
    p.add_argument("-c", type=int, default=32)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--profile", help="py-spy raw output file")
    args = p.parse_args()
    for rep in range(args.reps):
        r = one(args.n, args.c, args.profile, app_ref=app_ref, reset=reset, fill=fill)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()), flush=True)
    reset()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=10_000)
    p.add_argument("-c", type=int, default=32)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--profile", help="py-spy raw output file")
    p.add_argument("--gil", action="store_true", help="profile only the thread holding the GIL")
    p.add_argument("--top", help="print the heaviest frames of a py-spy raw file")
    args = p.parse_args()
    if args.top:
        top(args.top)
        return
    for rep in range(args.reps):
        r = one(args.n, args.c, args.profile, args.gil)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()), flush=True)
    _reset_all()


if __name__ == "__main__":
    main()
