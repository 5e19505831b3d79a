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

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from . import keys
from .brokers.base import Broker


class Snapshot(Protocol):
    """What a sample is taken from (``metrics.Snapshot``): when, and the live
    workers' announcements."""

    @property
    def at(self) -> float: ...
    @property
    def workers(self) -> Sequence[dict[str, Any]]: ...


PREFIX = keys.THROUGHPUT
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
