"""Where a W4 run's time goes, from the harness' completion records.

    python benchmarks/w4_waves.py RESULTS_DIR/scratch/done__dumbwaiter-redis__W4__rep1.log [...]
    python benchmarks/w4_waves.py --slots 50 FILE...

Each line of a ``done__*.log`` is ``kind id t_start t_end pid`` (the task
body's own ``time.monotonic()`` stamps).  W4's drain is N / (last end - first
start) and its ideal is ``slots`` / 10 ms, so the run's slot-time
(``slots`` x span) splits exactly into:

* ``work``: N x 10 ms, what the jobs asked for;
* ``overshoot``: each sleep's time past 10 ms (timers, a busy loop);
* ``ramp``: slots not yet filled before the first moment all are busy;
* ``tail``: slots emptied after the last job started;
* ``gaps``: slots idle in between (a freed slot waiting for its next job:
  a fetch round trip, a refill threshold, the loop busy elsewhere).

Efficiency = work / (slots x span).  The refill gap per slot reuse is also
given: jobs are matched to the slot freed most recently before they start
(the shortest gap each start could have had), which is what a worker that
starts a job the moment a slot frees would show as ~0.  Standard library only.
"""

from __future__ import annotations

import argparse
import bisect
from pathlib import Path

SLEEP = 0.010


def load(path: Path, kind: str = "sleep") -> list[tuple[float, float]]:
    rows: dict[int, tuple[float, float]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] != kind:
            continue
        rows.setdefault(int(parts[1]), (float(parts[2]), float(parts[3])))
    return sorted(rows.values())


def busy_profile(jobs: list[tuple[float, float]]) -> list[tuple[float, int]]:
    """(time, running jobs from then on) at each start and end."""
    ev = [(s, 1) for s, _ in jobs] + [(e, -1) for _, e in jobs]
    ev.sort(key=lambda x: (x[0], x[1]))  # an end before a start at the same instant
    out, n = [], 0
    for t, d in ev:
        n += d
        out.append((t, n))
    return out


def analyse(jobs: list[tuple[float, float]], slots: int) -> dict[str, float]:
    first = jobs[0][0]
    last = max(e for _, e in jobs)
    span = last - first
    total = slots * span
    durs = [e - s for s, e in jobs]
    work = len(jobs) * SLEEP
    over = sum(durs) - work
    prof = busy_profile(jobs)
    # ramp: idle slot-time until the first moment every slot is busy
    ramp = 0.0
    t_full = None
    prev_t, prev_n = first, 0
    for t, n in prof:
        if t_full is None:
            ramp += (slots - prev_n) * (t - prev_t)
            if n >= slots:
                t_full = t
        prev_t, prev_n = t, n
    last_start = jobs[-1][0]
    # tail: idle slot-time after the last start
    tail = 0.0
    prev_t, prev_n = first, 0
    for t, n in prof:
        if prev_t >= last_start:
            tail += (slots - prev_n) * (t - prev_t)
        prev_t, prev_n = t, n
    idle = total - sum(durs)
    gaps = idle - ramp - tail
    # refill gap: each start after the ramp, matched to the latest end before it
    ends = sorted(e for _, e in jobs)
    used = [False] * len(ends)
    refill = []
    t0 = t_full if t_full is not None else first
    for s, _ in jobs:
        if s <= t0:
            continue
        k = bisect.bisect_right(ends, s) - 1
        while k >= 0 and used[k]:
            k -= 1
        if k >= 0:
            used[k] = True
            refill.append(s - ends[k])
    durs.sort()
    refill.sort()
    # waves: starts closer than 0.3 ms to the previous one belong to one wave
    waves, prev = 0, None
    for s, _ in jobs:
        if prev is None or s - prev > 0.0003:
            waves += 1
        prev = s
    return {
        "n": len(jobs),
        "rate": len(jobs) / span,
        "eff": work / total,
        "span_ms": span * 1000,
        "ramp_ms": ((t_full - first) * 1000) if t_full is not None else float("nan"),
        "sleep_p50": durs[len(durs) // 2] * 1000,
        "sleep_p90": durs[int(len(durs) * 0.9)] * 1000,
        "sleep_max": durs[-1] * 1000,
        "busy_avg": sum(durs) / span,
        "over%": over / total * 100,
        "ramp%": ramp / total * 100,
        "tail%": tail / total * 100,
        "gaps%": gaps / total * 100,
        "refill_p50": (refill[len(refill) // 2] * 1000) if refill else float("nan"),
        "refill_p90": (refill[int(len(refill) * 0.9)] * 1000) if refill else float("nan"),
        "waves": waves,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--slots", type=int, default=50)
    p.add_argument("--kind", default="sleep")
    a = p.parse_args()
    cols = [
        ("rate", "{:7,.0f}"),
        ("eff", "{:.3f}"),
        ("span_ms", "{:6.1f}"),
        ("ramp_ms", "{:5.1f}"),
        ("sleep_p50", "{:6.2f}"),
        ("sleep_p90", "{:6.2f}"),
        ("sleep_max", "{:6.1f}"),
        ("busy_avg", "{:5.1f}"),
        ("over%", "{:5.1f}"),
        ("ramp%", "{:5.1f}"),
        ("tail%", "{:5.1f}"),
        ("gaps%", "{:5.1f}"),
        ("refill_p50", "{:6.2f}"),
        ("refill_p90", "{:6.2f}"),
        ("waves", "{:4d}"),
    ]
    print("| file | " + " | ".join(c for c, _ in cols) + " |")
    print("|---|" + "--:|" * len(cols))
    for f in a.files:
        jobs = load(f, a.kind)
        if not jobs:
            print(f"| {f.name} | no {a.kind} records |")
            continue
        r = analyse(jobs, a.slots)
        cells = " | ".join(fmt.format(r[c]) for c, fmt in cols)
        print(f"| {f.name} | {cells} |")


if __name__ == "__main__":
    main()
