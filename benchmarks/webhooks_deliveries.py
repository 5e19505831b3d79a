"""Webhook deliveries per second: one worker process against a plain httpx loop.

    python benchmarks/webhooks_deliveries.py [--deliveries 5000] [--concurrency 50]
        [--url redis://127.0.0.1:6379/1] [--endpoint-concurrency N] [--rounds 2]

A receiver (uvicorn, one process, on 127.0.0.1) answers 200 to every POST
and notes when each arrives.  Each round, in the same run:

* **plain loop**: this process POSTs N signed webhooks with one
  ``httpx.AsyncClient`` (pooled, 50 connections), 50 requests in flight:
  what a hand-written sender does, with no queue, no retries, no record;
* **dumbwaiter**: N deliveries are made with ``app.webhooks.send`` (not
  timed), then ONE ``dumbwaiter worker -c 50`` process delivers them: the
  delivery job (endpoint and breaker read, signing, the attempt log, the
  job's ack) and the POST through the loop's pooled, SSRF-guarded client.

Both are timed at the receiver, first arrival to last, so process start-up
is not counted.  The ratio is dumbwaiter / plain loop (the target is 0.8).
Runs under a fresh Redis prefix (``bench-hooks-<pid>``) and deletes its keys.
The endpoint has no concurrency limit unless ``--endpoint-concurrency`` is
given (a limit adds a slot take and release per delivery).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import dumbwaiter as dw

HERE = Path(__file__).resolve().parent

#: the app the worker process imports (``webhooks_deliveries:app``, from this folder)
app = dw.App(os.environ.get("DW_BENCH_URL", "memory://"))
app.webhooks.configure(allow_private=True, max_connections=50)


# -- the receiver (run as ``--receiver PORT`` in its own process) ------------------


class Counter:
    """200 to every POST; ``GET /stats`` answers count, first and last arrival."""

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            m = await receive()
            if not m.get("more_body"):
                break
        if scope["method"] == "POST":
            now = time.time()
            self.count += 1
            self.first = self.first or now
            self.last = now
            body = b"ok"
        elif scope["path"] == "/reset":
            self.count, self.first, self.last = 0, 0.0, 0.0
            body = b"reset"
        else:
            body = orjson.dumps({"count": self.count, "first": self.first, "last": self.last})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def run_receiver(port: int) -> None:
    import uvicorn

    uvicorn.run(
        Counter(),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="h11",
        ws="none",
        # a loaded machine leaves pooled connections idle for seconds: closing
        # them then races the next request on them (a ReadError, a retry)
        timeout_keep_alive=120,
    )


def stats(base: str) -> dict[str, Any]:
    import httpx

    return dict(orjson.loads(httpx.get(base + "/stats").content))


def wait_for(
    base: str, n: int, pid: int | None = None, timeout: float = 600.0
) -> tuple[dict[str, Any], float]:
    """The receiver's stats once ``n`` arrived, and the CPU seconds process
    ``pid`` used per webhook from its first arrival seen to the last."""
    deadline = time.monotonic() + timeout
    start: tuple[int, float] | None = None
    while True:
        s = stats(base)
        if pid is not None and start is None and s["count"] > 0:
            start = (s["count"], cpu_of(pid))
        if s["count"] >= n:
            per = 0.0
            if pid is not None and start is not None and s["count"] > start[0]:
                per = (cpu_of(pid) - start[1]) / (s["count"] - start[0])
            return s, per
        if time.monotonic() > deadline:
            raise TimeoutError(f"{s['count']} of {n} arrived")
        time.sleep(0.05)


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(s: dict[str, Any]) -> float:
    return (s["count"] - 1) / (s["last"] - s["first"])


# -- the two senders --------------------------------------------------------------


async def plain_loop(url: str, n: int, concurrency: int) -> None:
    """The hand-written sender: sign and POST, ``concurrency`` at a time."""
    import httpx

    from dumbwaiter.webhooks import new_secret, sign

    secret = new_secret()
    body = orjson.dumps({"type": "bench.event", "timestamp": "now", "data": {"i": 1}})
    todo = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=15.0) as client:

        async def one() -> None:
            for i in todo:
                ts = int(time.time())
                wid = f"msg_{i}"
                headers = {
                    "webhook-id": wid,
                    "webhook-timestamp": str(ts),
                    "webhook-signature": sign(secret, wid, ts, body),
                    "content-type": "application/json",
                }
                r = await client.post(url, content=body, headers=headers)
                r.raise_for_status()

        await asyncio.gather(*(one() for _ in range(concurrency)))


async def enqueue(bench: dw.App, url: str, n: int, endpoint_concurrency: int | None) -> None:
    ep = await bench.webhooks.aadd_endpoint(url, concurrency=endpoint_concurrency)
    for i in range(n):
        await bench.webhooks.asend(ep, "bench.event", {"i": i})


def worker(bench_url: str, concurrency: int) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DW_BENCH_URL": bench_url, "PYTHONPATH": path}
    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app",
        "webhooks_deliveries:app", "-c", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=HERE, env=env)


def _run(coro: Any) -> None:
    """On uvloop, as the worker's loop is (dumbwaiter/loop.py), so the plain
    loop is not slowed by a slower event loop than the worker gets."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--deliveries", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--url", default="redis://127.0.0.1:6379/1")
    ap.add_argument("--endpoint-concurrency", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--receiver", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.receiver is not None:
        run_receiver(args.receiver)
        return
    port = free_port()
    recv = subprocess.Popen([sys.executable, __file__, "--receiver", str(port)], cwd=HERE)
    base = f"http://127.0.0.1:{port}"
    n, c = args.deliveries, args.concurrency
    try:
        for _ in range(200):
            try:
                stats(base)
                break
            except Exception:
                time.sleep(0.05)
        print(f"{n} webhooks to one local receiver, {c} in flight, {args.rounds} round(s):")
        ratios: list[float] = []
        for r in range(args.rounds):
            import httpx

            httpx.get(base + "/reset")
            cpu = time.process_time()
            _run(plain_loop(base + "/hook", n, c))
            plain_cpu = (time.process_time() - cpu) / n
            plain = rate(wait_for(base, n)[0])

            httpx.get(base + "/reset")
            sep = "&" if "?" in args.url else "?"
            bench_url = f"{args.url}{sep}prefix=bench-hooks-{os.getpid()}-{r}"
            bench = dw.App(bench_url)
            bench.webhooks.configure(allow_private=True, max_connections=50)
            asyncio.run(enqueue(bench, base + "/hook", n, args.endpoint_concurrency))
            proc = worker(bench_url, c)
            try:
                got, ours_cpu = wait_for(base, n, proc.pid)
                ours = rate(got)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            _cleanup(bench_url)
            ratios.append(ours / plain)
            print(
                f"  round {r + 1}: plain httpx loop {plain:,.0f}/s "
                f"({plain_cpu * 1e6:,.0f} us CPU each), dumbwaiter worker {ours:,.0f}/s "
                f"({ours_cpu * 1e6:,.0f} us CPU each), ratio {ours / plain:.2f}"
            )
        ratios.sort()
        print(f"  median ratio {ratios[len(ratios) // 2]:.2f} (target 0.8)")
    finally:
        recv.send_signal(signal.SIGTERM)
        recv.wait(30)


def _cleanup(bench_url: str) -> None:
    if not bench_url.startswith("redis"):
        return
    import redis

    base, _, query = bench_url.partition("?")
    prefix = dict(p.split("=", 1) for p in query.split("&"))["prefix"]
    client = redis.Redis.from_url(base)
    try:
        keys = list(client.scan_iter(match=f"{{dw:{prefix}}}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


if __name__ == "__main__":
    main()
