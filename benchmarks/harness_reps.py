"""W1 enqueue per repetition of one peers run, beside the bare psycopg
``INSERT`` + ``COMMIT`` of the same repetition and a peer of the same
repetition (issue 25.1 on PostgreSQL).  Standard library only.

    python benchmarks/harness_reps.py RESULTS.json [RESULTS.json ...] [--lib dumbwaiter-postgres]
        [--peer pgqueuer]

Each repetition of ``run_all.sh`` runs the harness' limits (its bare
clients) and then every library's workloads, so a repetition's figures are
the nearest in time to each other; the medians of the per-repetition ratios
are printed last (over every repetition of every file given).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--lib", default="dumbwaiter-postgres")
    p.add_argument("--peer", default="pgqueuer")
    a = p.parse_args()
    rows: list[tuple[float, float]] = []
    for path in a.results:
        print(f"{path}:\n")
        rows += table(json.loads(path.read_text())["raw_records"], a.lib, a.peer)
        print()
    print(
        f"median of {len(rows)} per-rep ratios: ÷ bare {statistics.median(r[0] for r in rows):.2f},"
        f" ÷ {a.peer} {statistics.median(r[1] for r in rows):.2f}"
    )


def table(raw: list[dict[str, Any]], lib: str, peer: str) -> list[tuple[float, float]]:
    """Print one run's repetitions; return their (÷ bare, ÷ peer) ratios."""
    reps = sorted({r["rep"] for r in raw})
    rows = []
    print(f"| rep | bare INSERT /s | {lib} /s | {peer} /s | ÷ bare | ÷ {peer} | order |")
    print("|--:|--:|--:|--:|--:|--:|---|")
    for rep in reps:
        mine = [r for r in raw if r["rep"] == rep]
        bare = next(r for r in mine if r["workload"] == "limits")["python_pg"]
        anchor = float(bare["insert_commit_1by1_per_s"])
        got = {r["lib"]: r["enqueue_rate"] for r in mine if r["workload"] == "W1"}
        order = " then ".join(r["lib"] for r in mine if r["workload"] == "W1")
        ours, theirs = float(got[lib]), float(got[peer])
        rows.append((ours / anchor, ours / theirs))
        print(
            f"| {rep} | {anchor:,.0f} | {ours:,.0f} | {theirs:,.0f} | {ours / anchor:.2f}"
            f" | {ours / theirs:.2f} | {order} |"
        )
    return rows


if __name__ == "__main__":
    main()
