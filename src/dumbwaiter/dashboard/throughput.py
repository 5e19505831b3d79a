"""The overview's throughput chart: jobs finished per minute over the last hour.

Design: workers already publish cumulative counts (succeeded, retried, dead)
in their ``worker:ID`` announcement every heartbeat.  Whoever takes a broker
snapshot (the dashboard, a worker serving metrics, an alert evaluator)
stores, at most once a minute, one *sample* of every live worker's counts
under ``dumbwaiter:throughput:MINUTE`` with ``kv_add`` (the first sampler of
a minute wins, so any number of samplers write one sample), expiring after
two hours.  A minute's throughput is the growth of each worker's counts since
the previous minute's sample.

Why this way: it costs nothing on the hot path (no write per job), needs no
middleware in the workers, and is immune to the pruning of finished jobs
(counting stored ``succeeded`` rows would go backwards when old rows are
deleted).  The price: a worker that dies takes its last partial minute with
it, and minutes when nothing sampled are gaps in the chart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from ..brokers.base import Broker
    from ..metrics import Snapshot

PREFIX = "dumbwaiter:throughput:"
#: samples outlive the chart's hour, so the first minute of the chart has a predecessor
TTL = 2 * 3600.0
OUTCOMES = ("succeeded", "retried", "dead")

_written: dict[int, tuple[Broker, int]] = {}


def minute_of(t: float) -> int:
    return int(t // 60)


async def record_sample(broker: Broker, snap: Snapshot) -> bool:
    """Store this minute's sample unless one is stored; True if this call stored it."""
    minute = minute_of(snap.at)
    done = _written.get(id(broker))
    if done is not None and done[0] is broker and done[1] == minute:
        return False
    sample = {
        "at": snap.at,
        "workers": {
            str(w.get("id")): [
                *(int((w.get("counts") or {}).get(k, 0)) for k in OUTCOMES),
                float(w.get("started_at") or 0.0),
            ]
            for w in snap.workers
        },
    }
    stored = await broker.kv_add(f"{PREFIX}{minute}", orjson.dumps(sample), ttl=TTL)
    _written[id(broker)] = (broker, minute)
    return stored


@dataclass(frozen=True, slots=True)
class Point:
    """One minute of the chart (None counts: no sample, a gap)."""

    minute: int
    succeeded: int | None
    retried: int | None
    dead: int | None

    @property
    def total(self) -> int | None:
        if self.succeeded is None:
            return None
        return self.succeeded + (self.retried or 0) + (self.dead or 0)


async def series(broker: Broker, now: float, minutes: int = 60) -> list[Point]:
    """Per-minute outcomes for the last ``minutes`` minutes (oldest first), read
    with one ``kv_get`` of known keys (no scan)."""
    last = minute_of(now)
    wanted = list(range(last - minutes, last + 1))  # one extra: the first minute's predecessor
    raw = await broker.kv_get([f"{PREFIX}{m}" for m in wanted])
    samples: dict[int, dict[str, Any]] = {}
    for m in wanted:
        value = raw.get(f"{PREFIX}{m}")
        if value is None:
            continue
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            samples[m] = parsed
    out: list[Point] = []
    for m in wanted[1:]:
        cur, prev = samples.get(m), samples.get(m - 1)
        if cur is None or prev is None:
            out.append(Point(m, None, None, None))
            continue
        out.append(Point(m, *_growth(cur, prev)))
    return out


def _growth(cur: dict[str, Any], prev: dict[str, Any]) -> tuple[int, int, int]:
    before: dict[str, list[Any]] = prev.get("workers") or {}
    since = float(prev.get("at") or 0.0)
    sums = [0, 0, 0]
    for wid, counts in (cur.get("workers") or {}).items():
        old = before.get(wid)
        for i in range(3):
            if old is not None:
                sums[i] += max(0, int(counts[i]) - int(old[i]))
            elif float(counts[3]) >= since:
                sums[i] += int(counts[i])  # started after the previous sample: all its work is new
    return sums[0], sums[1], sums[2]


def nice_max(value: int) -> int:
    """A round upper bound for the chart's axis (1, 2, 5 x 10^k)."""
    if value <= 0:
        return 1
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * exp:
            return int(step * exp)
    return int(10 * exp)


def svg(points: list[Point], width: int = 720, height: int = 160) -> str:
    """An inline SVG bar chart (stacked: succeeded, retried, dead) of ``points``.

    Built from attributes and CSS classes only, so the page's Content Security
    Policy needs no inline styles; each bar has a <title> tooltip."""
    from datetime import datetime

    pad_l, pad_b, pad_t = 44, 18, 8
    plot_w, plot_h = width - pad_l - 4, height - pad_b - pad_t
    top = nice_max(max((p.total or 0) for p in points) if points else 0)
    n = max(1, len(points))
    bw = plot_w / n
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="jobs finished per minute, last hour">',
        f'<line class="axis" x1="{pad_l}" y1="{pad_t + plot_h}" x2="{width - 4}" '
        f'y2="{pad_t + plot_h}"/>',
        f'<text class="tick" x="{pad_l - 6}" y="{pad_t + 8}" text-anchor="end">{top}</text>',
        f'<text class="tick" x="{pad_l - 6}" y="{pad_t + plot_h}" text-anchor="end">0</text>',
        f'<line class="grid" x1="{pad_l}" y1="{pad_t}" x2="{width - 4}" y2="{pad_t}"/>',
    ]
    for i, p in enumerate(points):
        x = pad_l + i * bw
        label = datetime.fromtimestamp(p.minute * 60).strftime("%H:%M")
        if p.total is None:
            parts.append(
                f'<rect class="gap" x="{x:.1f}" y="{pad_t + plot_h - 2}" width="{bw - 1:.1f}" '
                f'height="2"><title>{label}: no sample</title></rect>'
            )
            continue
        y = float(pad_t + plot_h)
        for cls, value in (("ok", p.succeeded), ("retry", p.retried), ("dead", p.dead)):
            h = plot_h * (value or 0) / top
            if h <= 0:
                continue
            y -= h
            parts.append(
                f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{bw - 1:.1f}" '
                f'height="{h:.1f}"><title>{label}: {p.succeeded} succeeded, '
                f"{p.retried} retried, {p.dead} dead</title></rect>"
            )
        if i % 10 == 0:
            parts.append(f'<text class="tick" x="{x:.1f}" y="{height - 4}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)
