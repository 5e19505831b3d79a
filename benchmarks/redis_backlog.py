"""Drain speed of one worker on the Redis broker: empty queue vs. a backlog.

    flock /tmp/dw-bench.lock .venv/bin/python benchmarks/redis_backlog.py \
        [--backlog 1000000] [--n 10000] [--url redis://127.0.0.1:6379/1?prefix=backlog]

1. empty queue: enqueue ``--n`` no-op jobs (bulk), start one worker process
   (``dumbwaiter worker -c 32``), drain them: jobs/s = n / (last end - first
   start), as the peers harness measures W1 (``--reps`` times);
2. backlog: enqueue ``--backlog`` no-op jobs, start the worker again and
   drain them all; report the whole drain and the drain of each tenth (the
   first tenths run while most of the backlog is still queued);
3. empty queue again (``--reps`` times), with the backlog's million
   finished jobs still kept (retention), so a machine that got busier or
   quieter during the long drain shows in the baseline.

The machine's load average is recorded at each step: on a shared machine it
tells a slower drain from a busier machine.

Completion is recorded the harness' way: each job appends one line to a plain
file (one ``write(2)``), never to the broker.  Only the keys of the URL's
prefix are touched (deleted before and after), so other users of the same
database keep theirs.  Prints a Markdown table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

APP_MODULE = "redis_backlog_app"
HERE = Path(__file__).resolve().parent


def _write_app(folder: Path) -> None:
    """The worker's app module (task ``noop``, completion file from the env)."""
    (folder / f"{APP_MODULE}.py").write_text(
        "import os, time\n"
        "import dumbwaiter as dw\n"
        "app = dw.App(os.environ['BACKLOG_URL'])\n"
        "_fd = os.open(os.environ['BACKLOG_DONE'], os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
        "@app.task(name='noop')\n"
        "async def noop(i: int) -> None:\n"
        "    t = time.monotonic()\n"
        "    os.write(_fd, f'{i} {t:.6f} {time.monotonic():.6f}\\n'.encode())\n"
    )


def _clean(url: str) -> None:
    from dumbwaiter.brokers.redis.broker import PREFIX, parse_url

    rest, opts = parse_url(url)
    client = redis.Redis.from_url(rest)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{{dw:{opts[PREFIX] or 'default'}}}:*", count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


class _Tail:
    """Counts the completion file's lines, reading only what was appended
    since the last call (re-reading a file of a million lines five times a
    second would take a core of the two this machine has)."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "rb")  # closed by close()
        self.lines = 0

    def count(self) -> int:
        self.lines += self.f.read().count(b"\n")
        return self.lines

    def close(self) -> None:
        self.f.close()


def _drain(url: str, n: int, folder: Path, concurrency: int) -> dict[str, float]:
    done = folder / "done.log"
    done.write_bytes(b"")
    env = {
        **os.environ,
        "BACKLOG_URL": url,
        "BACKLOG_DONE": str(done),
        "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", f"{APP_MODULE}:app",
        "-q", "default", "-c", str(concurrency), "--log-level", "warning",
    ]  # fmt: skip
    worker = subprocess.Popen(cmd, env=env, cwd=folder)
    tail = _Tail(done)
    try:
        deadline = time.monotonic() + max(120.0, n / 2000)
        while tail.count() < n:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited with {worker.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tail.lines} of {n} jobs ran")
            time.sleep(0.2)
    finally:
        tail.close()
        worker.terminate()
        worker.wait(timeout=60)
    starts: list[float] = []
    ends: list[float] = []
    with open(done) as f:
        for line in f:
            _, s, e = line.split()
            starts.append(float(s))
            ends.append(float(e))
    starts.sort()
    ends.sort()
    out = {"jobs_per_s": n / (ends[-1] - starts[0])}
    tenth = n // 10
    for k in range(10):  # the k-th tenth of the jobs, in the order they started
        a, b = starts[k * tenth], starts[min((k + 1) * tenth, n - 1)]
        out[f"tenth_{k + 1}"] = tenth / (b - a) if b > a else 0.0
    return out


def _load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/1?prefix=backlog")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--reps", type=int, default=1, help="repetitions of the empty-queue drain")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    import tempfile

    import dumbwaiter as dw

    folder = Path(tempfile.mkdtemp(prefix="dw-backlog-"))
    _write_app(folder)
    app = dw.App(args.url)
    noop = app.task(name="noop")(lambda i: None)
    results: dict[str, object] = {"url": args.url, "n": args.n, "backlog": args.backlog}

    def empty_drains(clean: bool) -> list[dict[str, float]]:
        out = []
        for _ in range(args.reps):
            if clean:
                _clean(args.url)
            noop.enqueue_many(range(args.backlog, args.backlog + args.n))
            out.append({**_drain(args.url, args.n, folder, args.concurrency), "load": _load()})
        return out

    try:
        empty = empty_drains(clean=True)
        results["empty"] = empty
        _clean(args.url)
        t = time.perf_counter()
        for start in range(0, args.backlog, 50_000):
            noop.enqueue_many(range(start, min(start + 50_000, args.backlog)))
        results["backlog_enqueue_per_s"] = args.backlog / (time.perf_counter() - t)
        info = redis.Redis.from_url(args.url.split("?")[0]).info("memory")
        results["redis_used_memory_mb"] = info["used_memory"] / 2**20
        results["load_before_backlog"] = _load()
        results["full"] = _drain(args.url, args.backlog, folder, args.concurrency)
        results["load_after_backlog"] = _load()
        after = empty_drains(clean=False)
        results["empty_after"] = after
    finally:
        app.close()
        _clean(args.url)

    empty_rates = sorted(r["jobs_per_s"] for r in empty + after)
    base = empty_rates[len(empty_rates) // 2]
    full = results["full"]
    assert isinstance(full, dict)
    for label, runs in (("before", empty), ("after", after)):
        rates = ", ".join(f"{r['jobs_per_s']:,.0f} (load {r['load']:.1f})" for r in runs)
        print(f"empty-queue drains {label} the backlog: {rates}")
    print(
        f"load average {results['load_before_backlog']:.1f} when the backlog drain started, "
        f"{results['load_after_backlog']:.1f} when it ended\n"
    )
    print(
        f"| drain | jobs/s | ÷ empty |\n|---|--:|--:|\n| empty queue ({args.n:,} jobs, median "
        f"of the drains before and after) | {base:,.0f} | 1.00 |"
    )
    print(
        f"| backlog of {args.backlog:,}, whole drain | {full['jobs_per_s']:,.0f} "
        f"| {full['jobs_per_s'] / base:.2f} |"
    )
    for k in range(1, 11):
        r = full[f"tenth_{k}"]
        print(
            f"| backlog, tenth {k} ({(k - 1) * 10}-{k * 10}% drained) | {r:,.0f} | {r / base:.2f} |"
        )
    print(
        f"\nbacklog enqueued at {results['backlog_enqueue_per_s']:,.0f} jobs/s (bulk, 50,000 "
        f"per call); Redis used_memory with the backlog: {results['redis_used_memory_mb']:,.0f} MB"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
