"""Figures of one peers run, and dumbwaiter's ratios to each peer of that run.

    python benchmarks/ratios.py [benchmarks/results/peers/results.json] [--lib dumbwaiter-sqlite]

Reads the ``results.json`` that the harness' report wrote and prints two
markdown tables: the medians of every library, and ``lib ÷ peer`` for each
figure (higher is better for rates; lower is better for start-up, memory and
latency, so there a ratio under 1 favours ``lib``).  The library's own
targets are checked at the end.  Standard library only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parent / "results" / "peers" / "results.json"

#: (column, workload, metric, format, higher is better)
COLUMNS: list[tuple[str, str, str, str, bool]] = [
    ("W1 enqueue/s", "W1", "enqueue_rate", "{:,.0f}", True),
    ("W1 drain/s", "W1", "drain_rate", "{:,.0f}", True),
    ("W1 worker start s", "W1", "startup_s", "{:.2f}", False),
    ("W1 peak PSS MB", "W1", "peak_pss_mb", "{:.0f}", False),
    ("W2 bulk/s", "W2", "enqueue_rate", "{:,.0f}", True),
    ("W3 p50 ms", "W3", "p50_ms", "{:.2f}", False),
    ("W3 p95 ms", "W3", "p95_ms", "{:.2f}", False),
    ("W3 p99 ms", "W3", "p99_ms", "{:.2f}", False),
    ("W4 drain/s", "W4", "drain_rate", "{:,.0f}", True),
]

#: the project's targets on SQLite: (workload, metric, bound, at least?)
TARGETS: list[tuple[str, str, str, float, bool]] = [
    ("W1 drain", "W1", "drain_rate", 5_000, True),
    ("W2 bulk enqueue", "W2", "enqueue_rate", 50_000, True),
    ("W3 p50", "W3", "p50_ms", 5.0, False),
    ("W4 drain", "W4", "drain_rate", 4_000, True),
]


def median(data: dict[str, Any], workload: str, lib: str, metric: str) -> float | None:
    entry = data["workloads"].get(workload, {}).get(lib, {})
    stat = entry.get(metric)
    return float(stat["median"]) if stat else None


def cell(value: float | None, fmt: str, spread: dict[str, Any] | None = None) -> str:
    if value is None:
        return "—"
    text = fmt.format(value)
    if spread and spread.get("n", 1) > 1:
        text += f" ({fmt.format(spread['min'])}\N{EN DASH}{fmt.format(spread['max'])})"
    return text


def tables(data: dict[str, Any], lib: str) -> str:
    libs = sorted(data["workloads"]["W1"], key=lambda name: (name != lib, name))
    peers = [name for name in libs if name != lib]
    out = ["| library | " + " | ".join(c[0] for c in COLUMNS) + " |"]
    out.append("|---|" + "--:|" * len(COLUMNS))
    for name in libs:
        cells = []
        for _, w, metric, fmt, _ in COLUMNS:
            entry = data["workloads"].get(w, {}).get(name, {})
            cells.append(cell(median(data, w, name, metric), fmt, entry.get(metric)))
        label = f"**{name}**" if name == lib else name
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", f"{lib} ÷ peer (same run, medians):", ""]
    out.append("| peer | " + " | ".join(c[0] for c in COLUMNS) + " |")
    out.append("|---|" + "--:|" * len(COLUMNS))
    for peer in peers:
        cells = []
        for _, w, metric, _, _ in COLUMNS:
            mine, theirs = median(data, w, lib, metric), median(data, w, peer, metric)
            cells.append(f"{mine / theirs:.2f}" if mine is not None and theirs else "—")
        out.append(f"| {peer} | " + " | ".join(cells) + " |")
    lim = data.get("limits", {})
    one = (lim.get("sqlite_single_row_tx_per_s") or {}).get("median")
    batch = (lim.get("sqlite_batch1000_rows_per_s") or {}).get("median")
    w1, w2 = median(data, "W1", lib, "enqueue_rate"), median(data, "W2", lib, "enqueue_rate")
    out.append("")
    if one and w1:
        out.append(
            f"W1 enqueue ÷ bare sqlite3 1-row transactions (WAL, NORMAL), same run: "
            f"{w1:,.0f} / {one:,.0f} = {w1 / one:.3f}"
        )
    if batch and w2:
        out.append(
            f"W2 bulk ÷ bare sqlite3 rows in 1,000-row transactions (WAL, NORMAL), same run: "
            f"{w2:,.0f} / {batch:,.0f} = {w2 / batch:.3f}"
        )
    out += ["", "Targets:", ""]
    for label, w, metric, bound, at_least in TARGETS:
        value = median(data, w, lib, metric)
        if value is None:
            out.append(f"- {label}: no figure")
            continue
        ok = value >= bound if at_least else value <= bound
        sign = ">=" if at_least else "<="
        out.append(
            f"- {label}: {value:,.2f} (target {sign} {bound:,.0f}): "
            f"{'met' if ok else 'missed'}, {value / bound:.2f} of the target"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("results", nargs="?", default=str(DEFAULT), help="results.json of a run")
    ap.add_argument("--lib", default="dumbwaiter-sqlite", help="the library to compare")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    print(tables(data, args.lib))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
