"""The scaling signal: how many workers a queue needs now.

An autoscaler (KEDA, a cron job, a person) needs one number per queue it can
target, not five gauges to combine.  ``desired_workers`` is that number,
from one snapshot of the admin API (``metrics.Snapshot``): no history, so
``dumbwaiter stats``, the ``/metrics`` gauges and the dashboard give the same
answer for the same moment.

The arithmetic is in worker slots (one slot runs one job at a time):

* the slots busy now: ``running + prefetched`` (jobs the workers hold);
  while the queue keeps up, this is the load producers bring;
* the slots that would clear the ready backlog within ``target`` seconds:
  ``ready x job_seconds / target``, where ``job_seconds`` is the mean run
  time of the queue's jobs, which each worker measures and announces with
  its heartbeat (``job_seconds`` in ``worker:ID``).  A job cannot need more
  than one slot, so the term is at most ``ready``; where no worker ran a
  job of the queue yet, every ready job counts as a slot;

and ``desired_workers = ceil(slots / concurrency)``, the concurrency being
the mean of the live workers on the queue (``DEFAULT_CONCURRENCY`` when
none is).  A queue with anything waiting (scheduled or retrying jobs too)
wants at least one worker; an empty one wants none (scale to zero); a
paused one wants only what runs.  The drain rate behind it is
``running / job_seconds`` (jobs per second the busy slots finish), and lag
(``QueueStats.lag``) says how late the oldest ready job already is: an
autoscaler may scale on lag too, but lag only grows once it is too late.

A worker that serves several queues is counted on each: ``desired_workers``
is per queue, as if each had workers of its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .brokers.types import QueueStats

#: seconds in which the ready backlog should be cleared (``DUMBWAITER_DRAIN_TARGET``)
DEFAULT_DRAIN_TARGET = 60.0
DRAIN_TARGET_ENV = "DUMBWAITER_DRAIN_TARGET"
#: the concurrency assumed for a queue no live worker serves (``WorkerConfig``'s default)
DEFAULT_CONCURRENCY = 32


def drain_target() -> float:
    """``DUMBWAITER_DRAIN_TARGET`` seconds, else ``DEFAULT_DRAIN_TARGET``."""
    raw = os.environ.get(DRAIN_TARGET_ENV)
    if not raw:
        return DEFAULT_DRAIN_TARGET
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{DRAIN_TARGET_ENV}={raw!r}: give a number of seconds above 0")
    return value


@dataclass(frozen=True, slots=True)
class Scale:
    """One queue's scaling figures (see the module's docstring)."""

    queue: str
    #: live workers serving the queue
    workers: int
    #: mean run time of the queue's jobs as the workers measured it (None: not yet)
    job_seconds: float | None
    #: jobs per second the busy slots finish now (None: run time not known)
    drain_rate: float | None
    #: jobs held or waiting to be run, per live worker (all of them when none lives)
    backlog_per_worker: float
    #: the workers the queue needs to keep up and clear its ready jobs in the target
    desired_workers: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "job_seconds": self.job_seconds,
            "drain_rate": self.drain_rate,
            "backlog_per_worker": self.backlog_per_worker,
            "desired_workers": self.desired_workers,
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def scale(s: QueueStats, workers: Sequence[Mapping[str, Any]], target: float) -> Scale:
    """``s``'s figures, with the live workers' announcements ``workers``."""
    on = [w for w in workers if s.queue in (w.get("queues") or ())]
    concurrency = _mean([c for w in on if (c := _num(w.get("concurrency"))) and c > 0])
    times = [
        t
        for w in on
        if isinstance(per := w.get("job_seconds"), Mapping)
        and (t := _num(per.get(s.queue))) is not None
        and t > 0
    ]
    job_seconds = _mean(times)
    held = s.running + s.prefetched
    ready = 0 if s.paused else s.ready
    backlog = ready if job_seconds is None else min(ready, ready * job_seconds / target)
    slots = held + backlog
    desired = math.ceil(slots / (concurrency or DEFAULT_CONCURRENCY) - 1e-9)
    if desired == 0 and held + s.ready + s.scheduled + s.retrying > 0:
        desired = 1  # someone must be there when the waiting jobs come due
    return Scale(
        queue=s.queue,
        workers=len(on),
        job_seconds=job_seconds,
        drain_rate=None if job_seconds is None else s.running / job_seconds,
        backlog_per_worker=(held + s.ready) / max(1, len(on)),
        desired_workers=desired,
    )


def scales(
    stats: Sequence[QueueStats], workers: Sequence[Mapping[str, Any]], target: float | None = None
) -> list[Scale]:
    """``scale`` of every queue in ``stats`` (target: ``drain_target()``)."""
    t = drain_target() if target is None else target
    return [scale(s, workers, t) for s in stats]
