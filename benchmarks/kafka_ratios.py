"""Issue 21.4's targets for dumbwaiter on Kafka, as ratios within each
repetition of one peers run (``benchmarks/kafka_run.sh``).

    python benchmarks/kafka_ratios.py [benchmarks/results/peers-kafka/results.json]

Reads the raw records of the harness' ``results.json`` and prints, per
repetition and as the median over them:

* enqueue one at a time (W1 enqueue) / the bare ``send_and_wait`` (>= 0.9);
* bulk (W2) / the bare pipelined sends (>= 0.8);
* drain (W1) / the best Python peer on Kafka (>= 3);
* W3 pickup p50 - the bare client's p50, at the same fetch wait (<= 0.5 ms);

and beside each, what the floor (``aiokafka-redis-floor``: a Redis record
write while the copy is on its way) allows: the floor / the anchor, and
dumbwaiter / the floor.  Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parent / "results" / "peers-kafka" / "results.json"
US, BARE, FLOOR = "dumbwaiter-kafka", "aiokafka-bare", "aiokafka-redis-floor"
PEERS = ("taskiq-aio-kafka",)

#: (label, workload, metric, reference, bound, kind): kind "ratio" checks
#: ours / reference >= bound; "plus" checks ours - reference <= bound
TARGETS: list[tuple[str, str, str, str, float, str]] = [
    ("enqueue one at a time / send_and_wait", "W1", "enqueue_rate", BARE, 0.9, "ratio"),
    ("bulk / pipelined send", "W2", "enqueue_rate", BARE, 0.8, "ratio"),
    ("drain / best Python peer", "W1", "drain_rate", "peer", 3.0, "ratio"),
    ("W3 p50 - bare p50 (ms)", "W3", "p50_ms", BARE, 0.5, "plus"),
]


def figures(raw: list[dict[str, Any]]) -> dict[int, dict[tuple[str, str, str], float]]:
    """rep -> (lib, workload, metric) -> value, from the runs that went well."""
    out: dict[int, dict[tuple[str, str, str], float]] = defaultdict(dict)
    for r in raw:
        if r.get("status") != "ok" or r.get("lib") == "_limits":
            continue
        for metric in ("enqueue_rate", "drain_rate", "p50_ms", "p99_ms"):
            v = r.get(metric)
            if isinstance(v, (int, float)):
                out[r["rep"]][(r["lib"], r["workload"], metric)] = float(v)
    return out


def reference(fig: dict[tuple[str, str, str], float], ref: str, w: str, m: str) -> float | None:
    if ref != "peer":
        return fig.get((ref, w, m))
    peers = [v for p in PEERS if (v := fig.get((p, w, m))) is not None]
    return max(peers) if peers else None


def compare(ours: float, ref: float, kind: str) -> float:
    return ours / ref if kind == "ratio" else ours - ref


def report(raw: list[dict[str, Any]]) -> str:
    reps = figures(raw)
    lines = [
        "| target | bound | "
        + " | ".join(f"rep {r}" for r in sorted(reps))
        + " | median | floor / anchor (median) | dumbwaiter / floor (median) | met |",
        "|---|---|" + "---|" * len(reps) + "---|---|---|---|",
    ]
    for label, w, m, ref, bound, kind in TARGETS:
        vals: list[float] = []
        floors: list[float] = []
        of_floor: list[float] = []
        cells = []
        for rep in sorted(reps):
            fig = reps[rep]
            ours, base = fig.get((US, w, m)), reference(fig, ref, w, m)
            if ours is None or base is None:
                cells.append("—")
                continue
            v = compare(ours, base, kind)
            vals.append(v)
            cells.append(f"{v:.2f}")
            floor = fig.get((FLOOR, w, m))
            if ref == BARE and floor is not None and w in ("W1", "W2"):
                floors.append(floor / base)
                of_floor.append(ours / floor)
        med = statistics.median(vals) if vals else None
        ok = med is not None and (med >= bound if kind == "ratio" else med <= bound)
        met = "—" if med is None else ("yes" if ok else "no")
        sign = ">=" if kind == "ratio" else "<="
        lines.append(
            f"| {label} | {sign} {bound:g} | "
            + " | ".join(cells)
            + f" | {'—' if med is None else f'{med:.2f}'}"
            + f" | {f'{statistics.median(floors):.2f}' if floors else '—'}"
            + f" | {f'{statistics.median(of_floor):.2f}' if of_floor else '—'} | {met} |"
        )
    lines += [
        "",
        "| library | W1 enqueue/s | W1 drain/s | W2 bulk/s | W3 p50 / p99 ms |",
        "|---|---|---|---|---|",
    ]
    libs = sorted({lib for fig in reps.values() for lib, _, _ in fig})
    for lib in libs:

        def med(w: str, m: str, lib: str = lib) -> float | None:
            vs = [v for fig in reps.values() if (v := fig.get((lib, w, m))) is not None]
            return statistics.median(vs) if vs else None

        def rate(v: float | None) -> str:
            return "—" if v is None else f"{v:,.0f}"

        p50, p99 = med("W3", "p50_ms"), med("W3", "p99_ms")
        w3 = "—" if p50 is None or p99 is None else f"{p50:.1f} / {p99:.1f}"
        lines.append(
            f"| {lib} | {rate(med('W1', 'enqueue_rate'))} | {rate(med('W1', 'drain_rate'))} "
            f"| {rate(med('W2', 'enqueue_rate'))} | {w3} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="?", default=str(DEFAULT))
    args = ap.parse_args()
    data = json.loads(Path(args.results).read_text())
    print(report(data["raw_records"]))


if __name__ == "__main__":
    main()
