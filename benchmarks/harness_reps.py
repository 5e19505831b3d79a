"""W1 enqueue per repetition of one peers run, beside the bare psycopg
``INSERT`` + ``COMMIT`` of the same repetition and a peer of the same
repetition (issue 25.1 on PostgreSQL).  Standard library only.

    python benchmarks/harness_reps.py RESULTS.json [--lib dumbwaiter-postgres] [--peer pgqueuer]

Each repetition of ``run_all.sh`` runs the harness' limits (its bare
clients) and then every library's workloads, so a repetition's figures are
the nearest in time to each other; the medians of the per-repetition ratios
are printed last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--lib", default="dumbwaiter-postgres")
    p.add_argument("--peer", default="pgqueuer")
    a = p.parse_args()
    raw = json.loads(a.results.read_text())["raw_records"]
    reps = sorted({r["rep"] for r in raw})
    rows = []
    print(f"| rep | bare INSERT /s | {a.lib} /s | {a.peer} /s | ÷ bare | ÷ {a.peer} | order |")
    print("|--:|--:|--:|--:|--:|--:|---|")
    for rep in reps:
        mine = [r for r in raw if r["rep"] == rep]
        bare = next(r for r in mine if r["workload"] == "limits")["python_pg"]
        anchor = float(bare["insert_commit_1by1_per_s"])
        got = {r["lib"]: r.get("enqueue_rate") for r in mine if r["workload"] == "W1"}
        order = " then ".join(r["lib"] for r in mine if r["workload"] == "W1")
        ours, peer = float(got[a.lib]), float(got[a.peer])
        rows.append((ours / anchor, ours / peer))
        print(
            f"| {rep} | {anchor:,.0f} | {ours:,.0f} | {peer:,.0f} | {ours / anchor:.2f}"
            f" | {ours / peer:.2f} | {order} |"
        )
    print(
        f"\nmedian of per-rep ratios: ÷ bare {statistics.median(r[0] for r in rows):.2f},"
        f" ÷ {a.peer} {statistics.median(r[1] for r in rows):.2f}"
    )


if __name__ == "__main__":
    main()
