"""Two peers runs, before and after a change: did any dumbwaiter figure lose
ground against the peers measured in the same run?

    python benchmarks/compare_runs.py BEFORE.json AFTER.json [--tolerance 0.10] [--json]

Each run's ``results.json`` (the harness' report) is read on its own: for
every ``dumbwaiter-<broker>`` library, each figure is turned into a ratio to
the best peer on the same backend *in that run* (and, for the one-at-a-time
enqueue, into the harness' own ``enqueue ÷ bare client``).  Comparing those
ratios across the two runs cancels what the machine did between them (a
shared 2-core host drifts by more than the changes measured).  A figure
"holds" when its after-ratio is no worse than ``1 - tolerance`` times its
before-ratio; the exit status is 1 when any figure does not hold.

Standard library only, like ``ratios.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

#: (label, workload, metric, higher is better)
FIGURES: list[tuple[str, str, str, bool]] = [
    ("W1 enqueue", "W1", "enqueue_rate", True),
    ("W1 drain", "W1", "drain_rate", True),
    ("W1 PSS", "W1", "peak_pss_mb", False),
    ("W2 bulk", "W2", "enqueue_rate", True),
    ("W3 p50", "W3", "p50_ms", False),
    ("W3 p99", "W3", "p99_ms", False),
    ("W4 drain", "W4", "drain_rate", True),
]


class Row(NamedTuple):
    """One figure of one broker in both runs."""

    lib: str
    figure: str
    against: str  # what the ratio is taken to: a peer's name or "bare client"
    before: float
    after: float

    @property
    def change(self) -> float:
        """after ÷ before of the ratio, oriented so that above 1 is better."""
        return self.after / self.before

    def holds(self, tolerance: float) -> bool:
        return self.change >= 1 - tolerance


def _median(data: dict[str, Any], workload: str, lib: str, metric: str) -> float | None:
    cell = data["workloads"].get(workload, {}).get(lib, {}).get(metric)
    if not isinstance(cell, dict) or cell.get("median") in (None, 0):
        return None
    return float(cell["median"])


def _backend(data: dict[str, Any], lib: str) -> str | None:
    for per_lib in data["workloads"].values():
        if lib in per_lib and per_lib[lib].get("backend"):
            return str(per_lib[lib]["backend"])
    return None


def _ratios(
    data: dict[str, Any], lib: str, chosen: dict[str, str] | None = None
) -> dict[str, tuple[str, float]]:
    """figure -> (what it is compared with, ratio oriented so higher is better).

    The peer is the best one on the same backend, or the one ``chosen``
    names for the figure (so both runs compare with the same peer)."""
    backend = _backend(data, lib)
    peers = [
        name
        for name in {n for per_lib in data["workloads"].values() for n in per_lib}
        if not name.startswith("dumbwaiter") and _backend(data, name) == backend
    ]
    out: dict[str, tuple[str, float]] = {}
    for label, workload, metric, higher in FIGURES:
        mine = _median(data, workload, lib, metric)
        if mine is None:
            continue
        theirs = {p: v for p in peers if (v := _median(data, workload, p, metric)) is not None}
        best = (chosen or {}).get(label) or (
            (max if higher else min)(theirs, key=lambda p: theirs[p]) if theirs else None
        )
        if best in theirs:
            ratio = mine / theirs[best] if higher else theirs[best] / mine
            out[label] = (best, ratio)
    bare = _median(data, "W1", lib, "enqueue_vs_bare_client")
    if bare is not None:
        out["W1 enqueue ÷ bare"] = ("bare client", bare)
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[Row]:
    libs = sorted(
        {
            n
            for per_lib in after["workloads"].values()
            for n in per_lib
            if n.startswith("dumbwaiter")
        }
    )
    rows: list[Row] = []
    for lib in libs:
        new = _ratios(after, lib)
        old = _ratios(before, lib, {figure: peer for figure, (peer, _) in new.items()})
        for figure, (against, ratio) in new.items():
            if figure in old:
                rows.append(Row(lib, figure, against, old[figure][1], ratio))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--json", action="store_true", help="rows as JSON instead of a table")
    args = ap.parse_args()
    rows = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    if args.json:
        print(json.dumps([r._asdict() | {"change": r.change} for r in rows], indent=1))
    else:
        print("| library | figure | compared with | ratio before | ratio after | after ÷ before |")
        print("|---|---|---|--:|--:|--:|")
        for r in rows:
            flag = "" if r.holds(args.tolerance) else " **worse**"
            print(
                f"| {r.lib} | {r.figure} | {r.against} | {r.before:.2f} | {r.after:.2f} "
                f"| {r.change:.2f}{flag} |"
            )
    return 0 if all(r.holds(args.tolerance) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
