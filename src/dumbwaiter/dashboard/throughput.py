"""The overview's throughput chart: jobs finished per minute over the last hour,
read from the samples ``dumbwaiter.throughput`` writes (see there why it
samples the workers' announcements)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..throughput import PREFIX, minute_of

if TYPE_CHECKING:
    from ..brokers.base import Broker


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
