"""Figures of one peers run, and dumbwaiter's ratios to each peer of that run.

    python benchmarks/ratios.py [benchmarks/results/peers/results.json] [--lib dumbwaiter-sqlite]
    python benchmarks/ratios.py RESULTS.json --lib dumbwaiter-rabbitmq [--floor FLOOR.json]

Reads the ``results.json`` that the harness' report wrote and prints two
markdown tables: the medians of every library, and ``lib ÷ peer`` for each
figure (higher is better for rates; lower is better for start-up, memory and
latency, so there a ratio under 1 favours ``lib``).  The library's own
targets (the issues' absolute bounds, and the same bounds as ratios to
the peer or bare-client limit they were set against) are checked at the end.  Standard library only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NamedTuple

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


class Target(NamedTuple):
    """One of an issue's speed targets.

    ``bound`` is the issue's absolute figure.  The issues set those bounds
    from the harness' record run on this host (``../shared/bench/results``,
    a quiet moment); the machine is shared, and the absolute figures of a
    later run move by ±30 % with its load.  So each bound also names what it
    was set against (``ref``: a peer's median, or one of the harness' bare
    client limits, with its record figure ``ref_figure``), and the check is
    made twice: absolute, and as the ratio ``bound / ref_figure`` to the same
    reference measured in the same run.
    """

    label: str
    workload: str
    metric: str
    bound: float
    at_least: bool
    ref: str = ""  # "peer:<lib>" or "limit:<key>"; empty: absolute only
    ref_figure: float = 0.0


def _t(
    label: str,
    w: str,
    metric: str,
    bound: float,
    at_least: bool = True,
    ref: str = "",
    ref_figure: float = 0.0,
) -> Target:
    return Target(label, w, metric, bound, at_least, ref, ref_figure)


#: the issues' targets per library; reference figures are the record run's medians
TARGETS: dict[str, list[Target]] = {
    "dumbwaiter-sqlite": [
        _t("W1 drain", "W1", "drain_rate", 5_000),
        _t("W2 bulk enqueue", "W2", "enqueue_rate", 50_000),
        _t("W3 p50", "W3", "p50_ms", 5.0, False),
        _t("W4 drain", "W4", "drain_rate", 4_000),
    ],
    "dumbwaiter-redis": [  # issue 3
        _t("W1 drain", "W1", "drain_rate", 10_000, True, "peer:taskiq-stream", 3_457.9),
        _t("W1 enqueue", "W1", "enqueue_rate", 7_500, True, "peer:huey", 7_265.9),
        # the issue sets the enqueue targets against the bare client too
        # ("redis-py does about 8,000 one-by-one LPUSH/s and 155,000
        # pipelined"): the same run's bare client is the anchor least moved
        # by the peers' own variance
        _t(
            "W1 enqueue",
            "W1",
            "enqueue_rate",
            7_500,
            True,
            "limit:redis_py_lpush_1by1_per_s",
            8_006.0,
        ),
        _t("W2 bulk enqueue", "W2", "enqueue_rate", 100_000, True, "peer:rq-simple", 14_520.9),
        _t(
            "W2 bulk enqueue",
            "W2",
            "enqueue_rate",
            100_000,
            True,
            "limit:redis_py_lpush_pipeline1000_per_s",
            155_535.0,
        ),
        _t("W3 p50", "W3", "p50_ms", 0.7, False, "peer:huey", 0.947),
        _t("W3 p99", "W3", "p99_ms", 1.2, False, "peer:huey", 1.452),
        _t("W4 drain", "W4", "drain_rate", 4_500, True, "peer:dramatiq", 3_360.2),
        _t("W1 peak PSS MB", "W1", "peak_pss_mb", 40, False),
    ],
    "dumbwaiter-postgres": [  # issue 4
        _t("W1 drain", "W1", "drain_rate", 10_000, True, "peer:pgqueuer", 3_951.0),
        _t("W2 bulk enqueue", "W2", "enqueue_rate", 100_000, True, "peer:pgqueuer", 50_789.2),
        _t("W3 p50", "W3", "p50_ms", 2.0, False, "peer:pgqueuer", 2.551),
        _t("W3 p99", "W3", "p99_ms", 5.0, False, "peer:pgqueuer", 4.707),
        _t("W4 drain", "W4", "drain_rate", 4_500, True, "peer:pgqueuer", 3_616.4),
    ],
    "dumbwaiter-rabbitmq": [  # issue 7
        _t("W1 drain", "W1", "drain_rate", 8_000, True, "peer:dramatiq-rabbitmq", 4_062.9),
        _t(
            "W1 enqueue",
            "W1",
            "enqueue_rate",
            0.9 * 1_240.4,
            True,
            "limit:aio_pika_quorum_confirm_1by1_per_s",
            1_240.4,
        ),
        _t(
            "W2 bulk enqueue",
            "W2",
            "enqueue_rate",
            6_000,
            True,
            "limit:aio_pika_classic_confirm_pipelined1000_per_s",
            6_294.0,
        ),
        _t("W3 p50", "W3", "p50_ms", 1.0, False, "peer:dramatiq-rabbitmq", 1.196),
        _t("W4 drain", "W4", "drain_rate", 4_500, True, "peer:dramatiq-rabbitmq", 3_140.7),
    ],
    "dumbwaiter-nats": [  # issue 7
        _t("W1 drain", "W1", "drain_rate", 8_000, True, "peer:taskiq-nats", 3_215.2),
        _t(
            "W1 enqueue",
            "W1",
            "enqueue_rate",
            0.9 * 4_664.1,
            True,
            "limit:nats_py_js_publish_1by1_per_s",
            4_664.1,
        ),
        _t(
            "W2 bulk enqueue",
            "W2",
            "enqueue_rate",
            30_000,
            True,
            "limit:nats_py_js_publish_async1000_per_s",
            39_720.6,
        ),
        _t("W3 p50", "W3", "p50_ms", 1.0, False, "peer:taskiq-nats", 0.894),
        _t("W4 drain", "W4", "drain_rate", 4_500, True, "peer:taskiq-nats", 2_983.2),
    ],
}


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
    out += ["", "Targets (absolute; and as the same ratio to their reference, in this run):", ""]
    out += [check(data, lib, t) for t in TARGETS.get(lib, [])] or ["- none for this library"]
    return "\n".join(out)


#: written beside results.json by benchmarks/run.sh when a RabbitMQ library ran
FLOOR_FILE = "rabbitmq-floor.json"


def floor_lines(floor: dict[str, Any] | None, data: dict[str, Any], lib: str) -> list[str]:
    """W3 on RabbitMQ against the bare client's pickup of the same run
    (``benchmarks/rabbitmq_floor.py``): what the library adds, and whether
    the W3 target is under the floor a quorum queue sets for any client."""
    w3 = median(data, "W3", lib, "p50_ms")
    if floor is None or "rabbitmq" not in lib or w3 is None:
        return []
    cases = {(c["queue"], bool(c["confirms"])): c for c in floor.get("cases", [])}
    quorum = cases.get(("quorum", True))
    if quorum is None:
        return []
    out = ["", f"W3 p50 over the bare client's pickup, same run ({floor.get('at', '?')}):", ""]
    for (kind, confirms), c in cases.items():
        how = "with" if confirms else "without"
        wire = f", its bytes at the socket {c['socket_p50_ms']:.2f}" if "socket_p50_ms" in c else ""
        out.append(f"- bare aiormq, {kind} queue, {how} confirms: {c['p50_ms']:.2f} ms{wire}")
    out.append(f"- {lib}: {w3:.2f} ms = the bare quorum client + {w3 - quorum['p50_ms']:.2f} ms")
    # the strictest floor: the delivery's bytes at the consumer's socket
    floor = quorum.get("socket_p50_ms", quorum["p50_ms"])
    for t in TARGETS.get(lib, []):
        if t.workload == "W3" and t.metric == "p50_ms" and t.bound < floor:
            out.append(
                f"- the target (<= {t.bound:.2f} ms) is under the floor: on a quorum queue "
                f"a delivery's bytes took {floor:.2f} ms to reach the consumer in this run"
            )
    return out


def reference(data: dict[str, Any], t: Target) -> float | None:
    """The median of ``t``'s reference in this run (None when it did not run)."""
    kind, _, name = t.ref.partition(":")
    if kind == "peer":
        return median(data, t.workload, name, t.metric)
    if kind == "limit":
        stat = data.get("limits", {}).get(name)
        return float(stat["median"]) if isinstance(stat, dict) and stat.get("median") else None
    return None


def check(data: dict[str, Any], lib: str, t: Target) -> str:
    """One line: the figure against the bound, then against the reference."""
    value = median(data, t.workload, lib, t.metric)
    if value is None:
        return f"- {t.label}: no figure"

    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    sign = ">=" if t.at_least else "<="
    ok = value >= t.bound if t.at_least else value <= t.bound
    line = f"- {t.label}: {value:,.2f} (target {sign} {t.bound:,.2f}): {verdict(ok)}"
    if not t.ref:
        return line
    want = t.bound / t.ref_figure
    theirs = reference(data, t)
    if theirs is None:
        return line + f"; ÷ {t.ref} (target {sign} {want:.2f}): reference not in this run"
    ratio = value / theirs
    ok = ratio >= want if t.at_least else ratio <= want
    return line + (
        f"; ÷ {t.ref} {theirs:,.2f} = {ratio:.2f} (target {sign} {want:.2f}): {verdict(ok)}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("results", nargs="?", default=str(DEFAULT), help="results.json of a run")
    ap.add_argument("--lib", default="dumbwaiter-sqlite", help="the library to compare")
    ap.add_argument(
        "--floor", help=f"the run's RabbitMQ floor (default: {FLOOR_FILE} beside the results)"
    )
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    print(tables(data, args.lib))
    floor_path = Path(args.floor) if args.floor else Path(args.results).with_name(FLOOR_FILE)
    floor = json.loads(floor_path.read_text()) if floor_path.exists() else None
    for line in floor_lines(floor, data, args.lib):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
