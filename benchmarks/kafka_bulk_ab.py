"""Issue 21.4's bulk ratio on Kafka, two checkouts alternated: the harness'
W2 (10,000 no-op jobs through the bulk API) of the bare client, its floor
with a Redis record per job, and dumbwaiter from ``--base`` and from this
checkout, each in a fresh process as the harness runs it.

    PEERS_VENV=/tmp/peers-venv-kafka flock /tmp/dw-bench.lock \\
        .venv/bin/python benchmarks/kafka_bulk_ab.py [--base main] [--rounds 4]
    PYTHONPATH=src .venv/bin/python benchmarks/kafka_bulk_ab.py --profile [-n 10000]

Each turn is one ``python -m peers.run --lib L --workload W2`` of the
harness (``../shared/bench``) in the venv ``kafka_run.sh`` builds
(``PEERS_VENV``), with ``benchmarks/peers`` as its extra adapters:
``aiokafka-bare``, ``aiokafka-redis-floor`` and ``dumbwaiter-kafka`` twice,
its ``dumbwaiter`` from ``--base``'s ``src`` (``git archive`` into /tmp, put
first on ``PYTHONPATH``) and from this checkout's.  The four turns of a
round run in a rotated order, so none always runs first.  A fresh process
matters: in one that ran a bulk enqueue before, the same call is 20-30 %
cheaper (the heap the cyclic GC walks, the allocator's arenas), which hid
the gap the harness saw (docs/benchmarks.md, "Kafka bulk enqueue
(h-kbulk)").  Each turn also reports the GC collections during the call
(``gc.callbacks``, installed before the runner starts).

tansu is started once here (``kafka_bench.tansu``, as the tests start it)
unless ``DW_BENCH_KAFKA`` names a cluster.

``--profile``: one ``aenqueue_many`` of ``-n`` jobs in this process (this
checkout, the local Redis db 1) after a warm-up, under cProfile: the top
functions by own time, then dumbwaiter's own functions with their calls
and time per job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HARNESS = Path(os.environ.get("PEERS_HARNESS", REPO.parent / "shared" / "bench")).resolve()
VENV = Path(os.environ.get("PEERS_VENV", "/tmp/peers-venv-kafka"))
REDIS = os.environ.get("DW_BENCH_REDIS", "redis://127.0.0.1:6379/1")

#: the harness' runner, its W2 wrapped to count the GC's collections and
#: the CPU time (this process': ours, the client libraries') of the bulk call
RUN_W2 = """
import gc, json, sys, time
sys.path.insert(0, ".")
seen, began = {}, [0.0]
def note(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    else:
        n, t = seen.get(info["generation"], (0, 0.0))
        seen[info["generation"]] = (n + 1, t + time.perf_counter() - began[0])
gc.callbacks.append(note)
import peers.run as run
w_bulk = run.w_bulk
async def counted(adapter, *a, **k):
    bulk, cpu = adapter.enqueue_bulk, [0.0]
    async def timed(*a, **k):
        seen.clear()
        began = time.process_time()
        try:
            return await bulk(*a, **k)
        finally:
            cpu[0] = time.process_time() - began
    adapter.enqueue_bulk = timed
    res = await w_bulk(adapter, *a, **k)
    res["gc"] = {g: [n, round(t * 1e3, 1)] for g, (n, t) in sorted(seen.items())}
    res["cpu_s"] = cpu[0]
    return res
run.RUNNERS["W2"] = counted
sys.exit(run.main(sys.argv[1:]))
"""

TURNS = ("bare", "floor", "base", "this")
LIBS = {
    "bare": "aiokafka-bare",
    "floor": "aiokafka-redis-floor",
    "base": "dumbwaiter-kafka",
    "this": "dumbwaiter-kafka",
}


def turn(who: str, rep: int, servers: str, srcs: dict[str, Path], out: Path) -> dict[str, object]:
    env = {
        **os.environ,
        "PEERS_EXTRA_ADAPTERS": str(HERE / "peers"),
        "DW_BENCH_KAFKA": servers,
    }
    if who in srcs:
        env["PYTHONPATH"] = str(srcs[who])
    else:
        env.pop("PYTHONPATH", None)
    args = ["--lib", LIBS[who], "--workload", "W2", "--rep", str(rep), "--out", str(out)]
    subprocess.run(
        [str(VENV / "bin" / "python"), "-c", RUN_W2, *args],
        cwd=HARNESS, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    rec: dict[str, object] = json.loads(out.read_text().splitlines()[-1])
    if rec.get("status") != "ok":
        raise SystemExit(f"{who}: {rec.get('status')} {rec.get('error')}")
    return rec


def us_per_job(rec: dict[str, object]) -> float:
    return float(rec["cpu_s"]) * 1e6 / float(rec["n"])  # type: ignore[arg-type]


def ab(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from kafka_bench import running_tansu

    base = Path(tempfile.mkdtemp(prefix="kbulk-base-"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", args.base, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    srcs = {"base": base / "src", "this": REPO / "src"}
    base_rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.base],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    this_rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    print(f"base {args.base} ({base_rev}), this checkout (HEAD {this_rev}, working tree)")
    out = base / "raw.jsonl"
    rates: dict[str, list[float]] = {k: [] for k in TURNS}
    cpus: dict[str, list[float]] = {k: [] for k in TURNS}
    with running_tansu() as servers:
        for rnd in range(args.rounds):
            order = TURNS[rnd % 4 :] + TURNS[: rnd % 4]
            got = {}
            for who in order:
                rec = turn(who, rnd + 1, servers, srcs, out)
                got[who] = rec
                rates[who].append(float(rec["enqueue_rate"]))  # type: ignore[arg-type]
            r = {k: float(v["enqueue_rate"]) for k, v in got.items()}  # type: ignore[arg-type]
            cpu = " ".join(f"{k} {us_per_job(v):.1f}" for k, v in got.items())  # type: ignore[arg-type]
            for k, v in got.items():
                cpus[k].append(us_per_job(v))
            gcs = " ".join(
                f"{k} {'/'.join(str(n) for n, _ in v['gc'].values())}"  # type: ignore[attr-defined]
                for k, v in got.items()
            )
            print(
                f"round {rnd + 1} ({' '.join(order)}): /s bare {r['bare']:,.0f} floor "
                f"{r['floor']:,.0f} base {r['base']:,.0f} this {r['this']:,.0f} | ÷ floor: "
                f"base {r['base'] / r['floor']:.2f} this {r['this'] / r['floor']:.2f} | ÷ bare: "
                f"floor {r['floor'] / r['bare']:.2f} base {r['base'] / r['bare']:.2f} this "
                f"{r['this'] / r['bare']:.2f} | CPU us/job {cpu} | GC collections (gen0/1/2) {gcs} "
                f"| load {os.getloadavg()[0]:.1f}",
                flush=True,
            )

    def ratios(a: str, b: str) -> str:
        xs = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        return f"median {statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})"

    for a, b in (("base", "floor"), ("this", "floor"), ("floor", "bare"), ("base", "bare")):
        print(f"{a} ÷ {b}: {ratios(a, b)}")
    print(f"this ÷ bare: {ratios('this', 'bare')}")
    print(f"this ÷ base: {ratios('this', 'base')}")
    for k, xs in cpus.items():
        each = ", ".join(f"{x:.1f}" for x in xs)
        print(f"CPU us/job {k}: median {statistics.median(xs):.1f} ({each})")


async def profile(servers: str, n: int) -> None:
    """One ``aenqueue_many`` of ``n`` under cProfile, after a warm-up."""
    import cProfile
    import pstats

    import dumbwaiter as dw

    for size in (100, n):
        prefix = f"kb{secrets.token_hex(4)}"
        state = quote(f"{REDIS}?prefix={prefix}", safe="")
        app = dw.App(f"kafka://{servers}?prefix={prefix}&state={state}")

        @app.task(name="noop")
        async def noop(i: int) -> None:
            pass

        await app.broker.open()
        try:
            if size != n:
                await noop.aenqueue_many(range(size))
                continue
            prof = cProfile.Profile()
            wall, cpu = time.perf_counter(), time.process_time()
            prof.enable()
            await noop.aenqueue_many(range(n))
            prof.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            await app.aclose()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(30)
    print(f"dumbwaiter's own functions (n={n}; a coroutine counts a call per resumption):")
    rows = []
    for (file, line, fn), (_, calls, own, cum, _) in st.stats.items():  # type: ignore[attr-defined]
        if "dumbwaiter" in file:
            rows.append((cum, calls, own, f"{Path(file).name}:{line} {fn}"))
    for cum, calls, own, where in sorted(rows, reverse=True)[:40]:
        print(
            f"  {calls / n:7.3f}/job  cum {cum * 1e6 / n:6.1f} us/job  "
            f"own {own * 1e6 / n:5.1f}  {where}"
        )
    print(f"under the profiler: {n / wall:,.0f}/s, CPU {cpu * 1e6 / n:.1f} us/job")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("-n", type=int, default=10000)
    args = ap.parse_args()
    if not args.profile:
        ab(args)
        return
    sys.path.insert(0, str(HERE))
    from kafka_bench import running_tansu

    with running_tansu() as servers:
        asyncio.run(profile(servers, args.n))


if __name__ == "__main__":
    main()
