"""One app's drain on a Redis Cluster of 3 primaries against 1, in the same run.

    PYTHONPATH=src python benchmarks/redis_cluster_drain.py [-n 30000] [--queues 6]
        [--workers 3] [--rounds 3] [--json out.json]

Starts two clusters of its own on free loopback ports (``redis-server
--cluster-enabled yes``, no persistence, no replicas): three primaries
joined by ``redis-cli --cluster create``, and one primary that holds every
slot.  Each round, on each arm in turn (alternated, so a busier minute of a
shared machine falls on both):

1. a fresh prefix; ``-n`` no-op jobs enqueued in bulk over ``--queues``
   queues, named so that each primary of the 3-primary cluster owns the same
   number of them (the enqueue is timed too);
2. ``--workers`` worker processes, each on every queue (in a rotated order),
   connect, then all start on one signal and drain with the seam
   (``fetch(100)`` then ``ack``), until a fetch finds nothing;
3. drain jobs/s = n / (last ack - start signal), each primary's CPU
   (``INFO cpu``, user + sys) over the drain, per job, and the worker
   processes' CPU (``RUSAGE_CHILDREN``: connecting included), per job.

Arms: ``3p/queues`` and ``1p/queues`` (``layout=queues``), and ``3p/app``
(the default one-tag layout on 3 primaries: the whole app on one of them).
The workers call the broker seam directly (no App, no handler): the
client's share of the CPU is the smallest it can be, so the server's share
shows.  Prints a Markdown table (median of the rounds, min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from dumbwaiter.brokers import from_url
from dumbwaiter.message import Message, uuid7

WORKER = r"""
import asyncio, sys, time
from dumbwaiter.brokers import from_url

async def main(url, queues):
    b = from_url(url)
    await b.open()
    await b.stats()  # connected (and the layout checked) before the signal
    print("ready", flush=True)
    sys.stdin.readline()
    n, last = 0, 0.0
    while True:
        ds = await b.fetch(queues, 100, 60.0, 0, "w")
        if not ds:
            break
        await b.ack(ds)
        n += len(ds)
        last = time.time()
    await b.close()
    print(n, repr(last), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2].split(",")))
"""


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return int(port)


class Cluster:
    def __init__(self, root: Path, size: int) -> None:
        self.ports = [_free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.root = root

    def start(self) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        assert server and cli, "redis-server and redis-cli on PATH"
        for port in self.ports:
            d = self.root / str(port)
            d.mkdir(parents=True)
            cmd = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                   "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--appendonly", "no", "--save", "", "--logfile", str(d / "log")]  # fmt: skip
            self.procs.append(subprocess.Popen(cmd))
        for port in self.ports:
            _until(lambda p=port: _client(p).ping(), f"node {port}")  # type: ignore[misc]
        if len(self.ports) == 1:
            _client(self.ports[0]).execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]
        else:
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        for port in self.ports:
            _until(lambda p=port: _client(p).cluster("info")["cluster_state"] == "ok", "ok")  # type: ignore[misc]

    def owner(self, key: str) -> int:
        slot = key_slot(key.encode())
        for start, end, primary, *_ in _client(self.ports[0]).execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(slot)

    def cpu(self) -> dict[int, float]:
        out = {}
        for port in self.ports:
            info = _client(port).info("cpu")
            out[port] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return out

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=5)


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(what)


def spread_queues(cluster: Cluster, prefix: str, count: int) -> list[str]:
    """``count`` queue names, as many on each primary of ``cluster``."""
    per = {p: 0 for p in cluster.ports}
    want = -(-count // len(cluster.ports))
    out: list[str] = []
    i = 0
    while len(out) < count:
        q = f"q{i}"
        i += 1
        owner = cluster.owner(f"{{dw:{prefix}/q:{q}}}")
        if per[owner] < want:
            per[owner] += 1
            out.append(q)
    return out


async def _enqueue(url: str, queues: list[str], n: int) -> float:
    b = from_url(url)
    msgs = [
        Message(id=uuid7(), kind="task", name="noop", queue=queues[i % len(queues)], args=[i])
        for i in range(n)
    ]
    t0 = time.perf_counter()
    for i in range(0, n, 5000):
        await b.enqueue(msgs[i : i + 5000])
    took = time.perf_counter() - t0
    await b.close()
    return took


def one_round(
    cluster: Cluster, layout: str, queues: list[str], n: int, workers: int, tag: str
) -> dict[str, Any]:
    prefix = f"drain-{tag}"
    url = f"redis://127.0.0.1:{cluster.ports[0]}/0?prefix={prefix}&layout={layout}"
    enq = asyncio.run(_enqueue(url, queues, n))
    procs = []
    for w in range(workers):
        order = queues[w % len(queues) :] + queues[: w % len(queues)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, url, ",".join(order)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=os.environ.copy(),
            )
        )
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    cpu0 = cluster.cpu()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    go = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
    done, last = 0, 0.0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        k, at = out.split()
        done += int(k)
        last = max(last, float(at))
    cpu1 = cluster.cpu()
    # the worker processes, now waited for (the servers still run)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    assert done == n, (done, n)
    busy = {port: (cpu1[port] - cpu0[port]) * 1e6 / n for port in cluster.ports}
    return {
        "drain": n / (last - go),
        "enqueue": n / enq,
        "server_us_per_job": sum(busy.values()),
        "busiest_us_per_job": max(busy.values()),
        "workers_us_per_job": workers_cpu * 1e6 / n,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=30_000)
    p.add_argument("--queues", type=int, default=6)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dw-cluster-drain-"))
    three, one = Cluster(root / "three", 3), Cluster(root / "one", 1)
    try:
        three.start()
        one.start()
        arms = {
            "3p/queues": (three, "queues"),
            "1p/queues": (one, "queues"),
            "3p/app": (three, "app"),
        }
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
        for r in range(a.rounds):
            for name, (cluster, layout) in arms.items():
                # a prefix per round and arm; the prefix is part of each
                # queue's tag, so the names that spread evenly depend on it
                tag = f"x{r}{name.replace('/', '')}"
                qs = spread_queues(three, f"drain-{tag}", a.queues)
                results[name].append(one_round(cluster, layout, qs, a.n, a.workers, tag))
                print(name, results[name][-1], file=sys.stderr, flush=True)
    finally:
        three.stop()
        one.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"n={a.n}, queues={a.queues}, worker processes={a.workers}, rounds={a.rounds}, "
          f"load average at the end: {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print(
        "| arm | drain jobs/s | enqueue jobs/s | server CPU µs/job (all primaries) "
        "| busiest primary µs/job | worker processes' CPU µs/job |"
    )
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        cells = []
        keys = ("drain", "enqueue", "server_us_per_job", "busiest_us_per_job", "workers_us_per_job")
        for key in keys:
            vals = [row[key] for row in rows]
            cells.append(f"{statistics.median(vals):,.0f} ({min(vals):,.0f}-{max(vals):,.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
