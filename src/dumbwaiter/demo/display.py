"""What the demo prints: the live queue table, the report tables, small helpers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from ..brokers.types import QueueStats


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of already sorted values (0 if none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def queue_table(
    title: str,
    stats: Mapping[str, QueueStats],
    tasks: Mapping[str, str],
    caption: str,
) -> Table:
    """One row per queue: ready, running, retrying, succeeded, dead."""
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("queue")
    table.add_column("task")
    for name in ("ready", "running", "retrying", "succeeded", "dead"):
        table.add_column(name, justify="right")
    for queue, task in tasks.items():
        s = stats.get(queue) or QueueStats(queue=queue)
        table.add_row(
            queue,
            task,
            str(s.ready),
            str(s.running),
            str(s.retrying),
            str(s.succeeded),
            f"[red]{s.dead}[/]" if s.dead else "0",
        )
    return table


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    task: str
    queue: str
    succeeded: int
    after_retry: int
    dead: int


def outcome_table(rows: Sequence[TaskOutcome]) -> Table:
    table = Table(title_justify="left")
    table.add_column("task")
    table.add_column("queue")
    table.add_column("done", justify="right")
    table.add_column("of which after a retry", justify="right")
    table.add_column("dead-lettered", justify="right")
    for r in rows:
        table.add_row(
            r.task,
            r.queue,
            str(r.succeeded),
            str(r.after_retry),
            f"[red]{r.dead}[/]" if r.dead else "0",
        )
    return table


def delivery_table(rows: Sequence[tuple[str, int, int]]) -> Table:
    """(what, count, missing) per effect the demo checks."""
    table = Table(title_justify="left")
    table.add_column("")
    table.add_column("count", justify="right")
    table.add_column("missing", justify="right")
    for what, count, missing in rows:
        table.add_row(what, str(count), f"[red]{missing}[/]" if missing else "0")
    return table
