"""A web endpoint that enqueues: what 2 enqueues + 1 publish add to a request.

    python benchmarks/web_endpoint.py [--brokers redis postgres nats] [--rounds 5]
        [--requests 1000] [--warmup 200] [--concurrency 4] [--no-worker]
        [--profile 300 [--profile-clock cpu|wall]] [--json]

For each broker, one uvicorn process serves the FastAPI app of
``web_endpoint_app.py`` and one ``dumbwaiter worker`` process runs its jobs
(so the queues drain as they would in production).  A third process, the
load client, POSTs orders with httpx over keep-alive connections, closed
loop, ``--concurrency`` requests in flight, and records each request's
latency.  The routes, alternated in rounds (save, dw, bare, save, dw,
bare, ...) because the machine is shared and its load moves:

* ``save``: INSERT the order's row through the app's own psycopg pool;
* ``dw``:   the save, then ``aenqueue`` twice and ``apublish`` once;
* ``bare``: the save, then the same three writes with the broker's own
  client (redis-py LPUSH x2 + XADD; psycopg INSERT x3, each committed;
  nats-py JetStream publish x3, each acknowledged);
* ``floor`` (PostgreSQL only): the save, then the writes the dw route must
  make, with bare psycopg, one statement each: two job rows into the
  broker's ``dw_jobs`` with their NOTIFY, then the event's log row and its
  delivery's job row with its NOTIFY (web_endpoint_app.py).

Per route and round: p50, p90, p99 and requests/s at the client, and the
endpoint's own timings (the save and each of the three calls, median).  The
figures are the median over rounds (min-max); "added p50" is a route's p50
minus the save route's in the same round.  ``--profile N`` then runs N
requests of ``dw`` and of ``bare`` under cProfile in the server (not timed),
counting the server thread's CPU (``--profile-clock wall``: wall time, which
also counts what a call waited off the CPU).

The save writes to ``--save-dsn`` (PostgreSQL, every broker).  Each run
makes its own namespace (a Redis prefix, a PostgreSQL schema, NATS streams)
and tables, and drops them at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROUTES = ("save", "dw", "bare", "floor")
#: routes only some brokers have
ONLY = {"floor": ("postgres",)}
#: per route and round, from the load client
FIGURES = ("p50_ms", "p90_ms", "p99_ms", "rps", "server_cpu_us", "worker_cpu_us")
BROKERS = {
    "redis": "redis://127.0.0.1:6379/1",
    "postgres": "postgresql://127.0.0.1:5432/test",
    "nats": "nats://127.0.0.1:4222",
}
SAVE_DSN = "postgresql://127.0.0.1:5432/test"


# -- the load client (run as ``--load BASE`` in its own process) -------------------


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_xs:
        return 0.0
    k = max(0, min(len(sorted_xs) - 1, round(q / 100 * len(sorted_xs) + 0.5) - 1))
    return sorted_xs[k]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2 if n else 0.0


async def _batch(client: Any, route: str, n: int, concurrency: int, tag: str) -> dict[str, Any]:
    """``n`` POSTs to one route, ``concurrency`` in flight: latencies and rate."""
    todo = iter(range(n))
    lat: list[float] = []
    clock = time.perf_counter

    async def one() -> None:
        for i in todo:
            body = {"id": f"{tag}-{route}-{i}", "email": "ann@example.com", "total_cents": 1299}
            t = clock()
            r = await client.post(f"/orders/{route}", json=body)
            lat.append(clock() - t)
            if r.status_code != 201:
                raise RuntimeError(f"POST /orders/{route}: {r.status_code} {r.text[:300]}")

    t0 = clock()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    wall = clock() - t0
    lat.sort()
    ms = [x * 1e3 for x in lat]
    return {
        "n": n,
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "rps": n / wall,
    }


async def load(base: str, a: argparse.Namespace) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=a.concurrency, max_keepalive_connections=a.concurrency)
    routes = a.routes
    rounds: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as client:
        for route in routes:
            await _batch(client, route, a.warmup, a.concurrency, f"w{os.getpid()}")
        for r in range(a.rounds):
            got: dict[str, Any] = {}
            for route in routes:
                await client.post("/timings/reset")
                cpu = [cpu_of(pid) for pid in a.pids]
                got[route] = await _batch(client, route, a.requests, a.concurrency, f"r{r}")
                # CPU per request of the server and the worker: steadier than
                # latency on a shared machine, and it says who spends it
                for name, pid, before in zip(("server", "worker"), a.pids, cpu, strict=False):
                    got[route][f"{name}_cpu_us"] = (cpu_of(pid) - before) / a.requests * 1e6
                parts = (await client.get("/timings")).json().get(route, {})
                got[route]["endpoint_us"] = parts.get("p50_us", [])
            rounds.append(got)
        profiles: dict[str, str] = {}
        for route in [r for r in routes if r != "save"] if a.profile else ():
            await client.post("/profile/start", params={"clock": a.profile_clock})
            await _batch(client, route, a.profile, a.concurrency, "prof")
            profiles[route] = (await client.post("/profile/stop")).json()["tottime"]
    return {"rounds": rounds, "profiles": profiles}


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _uvloop_run(coro: Any) -> Any:
    """On uvloop, as uvicorn's server loop is, when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- the server and the worker ------------------------------------------------------


def serve(port: int) -> None:
    import uvicorn

    sys.path.insert(0, str(HERE))
    uvicorn.run(
        "web_endpoint_app:api",
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=120,  # a loaded machine leaves connections idle for seconds
    )


def _env(url: str, tag: str, save_dsn: str) -> dict[str, str]:
    # absolute: the server and the worker run in this folder, where a relative
    # ``PYTHONPATH=src`` would miss the checkout and import an installed copy
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    path = os.pathsep.join([str(HERE), *(str(Path(p).resolve()) for p in inherited if p)])
    return {
        **os.environ,
        "DW_BENCH_URL": url,
        "DW_BENCH_TAG": tag,
        "DW_BENCH_SAVE_DSN": save_dsn,
        "PYTHONPATH": path,
    }


def _wait_up(base: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            httpx.get(base + "/timings", timeout=2.0).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def processes(url: str, tag: str, a: argparse.Namespace) -> Iterator[tuple[str, list[int]]]:
    """The server (and the worker, unless ``--no-worker``) for one broker;
    yields the server's base URL and their process ids."""
    env = _env(url, tag, a.save_dsn)
    port = free_port()
    me = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen([*me, "--serve", str(port)], cwd=HERE, env=env)
    worker: subprocess.Popen[bytes] | None = None
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_up(base, server)
        if not a.no_worker:
            cmd = [
                sys.executable, "-m", "dumbwaiter", "worker", "--app",
                "web_endpoint_app:app", "--log-level", "WARNING",
            ]  # fmt: skip
            worker = subprocess.Popen(cmd, cwd=HERE, env=env)
        yield base, [p.pid for p in (server, worker) if p is not None]
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drained(url: str, no_worker: bool, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The queues once the worker has caught up (``dumbwaiter stats``, as an
    operator would read them): what the dw route left, run or not."""
    cmd = [sys.executable, "-m", "dumbwaiter", "stats", "--url", url, "--json"]
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=_env(url, "", ""))
        rows: list[dict[str, Any]] = json.loads(out.stdout)["queues"]
        busy = sum(r.get(k) or 0 for r in rows for k in ("ready", "running", "prefetched"))
        if no_worker or busy == 0 or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


# -- namespaces: made before a broker's run, dropped after --------------------------


def broker_url(kind: str, server: str, tag: str) -> str:
    if kind == "postgres":
        return f"{server}?schema={tag}"
    return f"{server}?prefix={tag}"


def setup(kind: str, server: str, url: str, tag: str, save_dsn: str) -> None:
    import psycopg
    from web_endpoint_app import nats_subject

    with psycopg.connect(save_dsn, autocommit=True) as c:
        c.execute(
            f"CREATE TABLE {tag}_orders (id text PRIMARY KEY, email text NOT NULL,"
            " total_cents integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
    if kind == "postgres":
        # the schema as production makes it (not ``?migrate=auto``)
        migrate = [sys.executable, "-m", "dumbwaiter", "migrate", "--url", url]
        subprocess.run(migrate, check=True, capture_output=True)
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(
                f"CREATE TABLE {tag}_jobs (id bigserial PRIMARY KEY, queue text NOT NULL,"
                " body bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            )
    elif kind == "nats":

        async def stream() -> None:
            import nats

            nc = await nats.connect(server)
            try:
                subject = nats_subject(tag)
                await nc.jetstream().add_stream(name=subject, subjects=[f"{subject}.>"])
            finally:
                await nc.close()

        asyncio.run(stream())


def cleanup(kind: str, server: str, tag: str, save_dsn: str) -> None:
    import psycopg

    with psycopg.connect(save_dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {tag}_orders")
    if kind == "postgres":
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {tag}_jobs")
            c.execute(f"DROP SCHEMA IF EXISTS {tag} CASCADE")
    elif kind == "redis":
        import redis

        client = redis.Redis.from_url(server)
        try:
            for pattern in (f"{{dw:{tag}}}:*", f"{tag}:*"):
                keys = list(client.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 500):
                    client.delete(*keys[i : i + 500])
        finally:
            client.close()
    elif kind == "nats":
        from web_endpoint_app import nats_subject

        from dumbwaiter.brokers.nats.names import stream_names

        async def streams() -> None:
            import nats
            from nats.js.errors import NotFoundError

            nc = await nats.connect(server)
            try:
                js = nc.jetstream()
                for s in (*stream_names(tag), nats_subject(tag)):
                    with contextlib.suppress(NotFoundError):
                        await js.delete_stream(s)
            finally:
                await nc.close()

        asyncio.run(streams())


# -- figures ----------------------------------------------------------------------


def spread(xs: list[float]) -> dict[str, float]:
    """Median over rounds, with the lowest and highest round."""
    return {"median": median(xs), "min": min(xs), "max": max(xs)}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per route: each figure's median (min-max) over rounds; added p50 against
    the same round's save; the endpoint's own parts (median of the rounds'
    medians, microseconds: save, call 1, call 2, call 3)."""
    routes = list(rounds[0])
    out: dict[str, Any] = {}
    for route in routes:
        rs = [r[route] for r in rounds]
        fig: dict[str, Any] = {k: spread([x[k] for x in rs]) for k in FIGURES if k in rs[0]}
        if route != "save" and "save" in routes:
            fig["added_p50_ms"] = spread([r[route]["p50_ms"] - r["save"]["p50_ms"] for r in rounds])
        parts = [x["endpoint_us"] for x in rs if x.get("endpoint_us")]
        fig["endpoint_us"] = (
            [median(list(col)) for col in zip(*parts, strict=True)] if parts else []
        )
        out[route] = fig
    # ratios of medians: a round's bare added p50 can be near zero, or below
    for top, bottom in (("dw", "bare"), ("dw", "floor"), ("floor", "bare")):
        if top in out and bottom in out:
            under = out[bottom]["added_p50_ms"]["median"]
            over = out[top]["added_p50_ms"]["median"]
            out[f"{top}_over_{bottom}_added_p50"] = over / under if under > 0 else None
    return out


def print_table(kind: str, s: dict[str, Any], a: argparse.Namespace) -> None:
    def f(x: dict[str, float], digits: int = 2) -> str:
        return f"{x['median']:.{digits}f} ({x['min']:.{digits}f}-{x['max']:.{digits}f})"

    print(
        f"\n{kind}: {a.rounds} round(s) x {a.requests} requests per route, "
        f"{a.concurrency} in flight"
    )
    print(
        f"  {'route':<5} {'p50 ms':>18} {'p90 ms':>18} {'p99 ms':>20} {'req/s':>16} "
        f"{'added p50 ms':>18}"
    )
    for route in ROUTES:
        if route not in s:
            continue
        r = s[route]
        added = f(r["added_p50_ms"]) if "added_p50_ms" in r else "-"
        print(
            f"  {route:<5} {f(r['p50_ms']):>18} {f(r['p90_ms']):>18} {f(r['p99_ms']):>20} "
            f"{f(r['rps'], 0):>16} {added:>18}"
        )
    for route in ROUTES:
        parts = s.get(route, {}).get("endpoint_us")
        if parts:
            names = ["save", "call 1", "call 2", "call 3"][: len(parts)]
            inside = ", ".join(f"{n} {p / 1e3:.2f}" for n, p in zip(names, parts, strict=True))
            print(f"  inside the endpoint, {route}, p50 ms: {inside}")
    for route in ROUTES:
        r = s.get(route, {})
        cpu = [
            f"{who} {f(r[k], 0)}"
            for who, k in (("server", "server_cpu_us"), ("worker", "worker_cpu_us"))
            if k in r
        ]
        if cpu:
            print(f"  CPU per request, {route}, us: {', '.join(cpu)}")
    for top, bottom in (("dw", "bare"), ("dw", "floor"), ("floor", "bare")):
        ratio = s.get(f"{top}_over_{bottom}_added_p50")
        if ratio is not None:
            print(f"  {top} added p50 / {bottom} added p50 (medians): {ratio:.2f}")


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "platform": platform.platform(),
    }


def _exit_on_term(signum: int, _frame: Any) -> None:
    sys.exit(128 + signum)  # unwinds: the server and worker stop, namespaces drop


def run(a: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    signal.signal(signal.SIGTERM, _exit_on_term)
    report: dict[str, Any] = {
        "args": {
            k: getattr(a, k) for k in ("rounds", "requests", "warmup", "concurrency", "routes")
        }
        | {"worker": not a.no_worker, "profile": a.profile, "profile_clock": a.profile_clock},
        "machine": machine(),
        "brokers": {},
    }
    for i, server in enumerate(BROKERS.get(b, b) for b in a.brokers):
        kind = _kind(server)
        tag = f"bw{os.getpid()}x{i}"
        url = broker_url(kind, server, tag)
        routes = [r for r in a.routes if kind in ONLY.get(r, (kind,))]
        setup(kind, server, url, tag, a.save_dsn)
        try:
            with processes(url, tag, a) as (base, pids):
                cmd = [
                    sys.executable, str(Path(__file__).resolve()), "--load", base,
                    "--rounds", str(a.rounds), "--requests", str(a.requests),
                    "--warmup", str(a.warmup), "--concurrency", str(a.concurrency),
                    "--profile", str(a.profile), "--profile-clock", a.profile_clock,
                    "--routes", *routes,
                    "--pids", *map(str, pids),
                ]  # fmt: skip
                out = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"the load client failed:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout)
                got["queues_after"] = drained(url, a.no_worker)
        finally:
            cleanup(kind, server, tag, a.save_dsn)
        entry = {
            "url": url.split("?")[0],
            "namespace": tag,
            "summary": summarize(got["rounds"]),
            **got,
        }
        report["brokers"][kind] = entry
        if not a.json:
            print_table(kind, entry["summary"], a)
            left = {
                r["queue"]: (r["succeeded"], r["ready"], r["dead"]) for r in got["queues_after"]
            }
            print(f"  queues after the run (succeeded, ready, dead): {left}")
            for route, text in got["profiles"].items():
                print(f"\n  cProfile, {a.profile} requests of {route} (server, by tottime):")
                print(text)
    report["machine"]["loadavg_after"] = os.getloadavg()
    return report


def _kind(server: str) -> str:
    scheme = server.split("://", 1)[0]
    kinds = {"redis": "redis", "rediss": "redis", "postgresql": "postgres", "postgres": "postgres"}
    if scheme == "nats":
        return "nats"
    if scheme not in kinds:
        raise SystemExit(
            f"--brokers: {server!r} is not redis, postgres, nats or a URL of one of them"
        )
    return kinds[scheme]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--brokers", nargs="+", default=list(BROKERS),
        help="redis, postgres, nats, or a server URL of one of them (default: all three)",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=5, help="rounds of save, dw, bare")
    p.add_argument("--requests", type=int, default=1000, help="requests per route and round")
    p.add_argument("--warmup", type=int, default=200, help="requests per route before the rounds")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--save-dsn", default=SAVE_DSN, help="the PostgreSQL database of the save")
    p.add_argument("--no-worker", action="store_true", help="run no worker (jobs pile up)")
    p.add_argument(
        "--profile", type=int, default=0, help="then N requests of dw and bare under cProfile"
    )
    p.add_argument(
        "--profile-clock", choices=("cpu", "wall"), default="cpu",
        help="cpu: the server thread's CPU; wall: also the time calls waited off the CPU",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--load", help=argparse.SUPPRESS)
    p.add_argument("--pids", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve is not None:
        serve(a.serve)
        return
    if a.load is not None:
        print(json.dumps(_uvloop_run(load(a.load, a))))
        return
    if min(a.rounds, a.requests, a.concurrency) < 1 or a.warmup < 0 or a.profile < 0:
        p.error("--rounds, --requests and --concurrency must be at least 1")
    for b in a.brokers:
        _kind(BROKERS.get(b, b))  # a clear error before anything starts
    report = run(a)
    if a.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
