"""The alert rules: each looks at the broker's admin view (a ``Snapshot``
of every queue's counts, the workers, the scheduler) and says for which
subjects its condition holds now (``Finding``).  ``AlertService``
(alerts.py) evaluates them and sends what fires; ``promrules.py`` writes
the same rules for Prometheus (``promql``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from . import keys
from .brokers.types import JobFilter
from .metrics import SCHEDULER_SLACK, Snapshot
from .state import State
from .text import duration

if TYPE_CHECKING:
    from .brokers.base import Broker
    from .brokers.types import JobInfo, QueueStats

#: per queue: (last pass, first look) of the dead-letter watch (``DeadLetters``)
SEEN = keys.ALERT + "seen-dead:"
#: seconds each dead-letter window overlaps the previous one
DEAD_OVERLAP = 5.0
#: dead letters read per queue and pass (the message says "100+" beyond)
DEAD_PAGE = 100
#: the SEEN key of the broker-wide start of the dead-letter watch
WATCH = "*"


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule's condition holds for ``subject`` (a queue, or ``scheduler``)."""

    subject: str
    value: float
    threshold: float
    summary: str
    #: part of the de-duplication key of event-like rules (dead letters)
    change: str = ""


@dataclass(slots=True)
class Evaluation:
    """What a rule may use while it checks: the broker and the time."""

    broker: Broker
    now: float


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Base of the rules: a name, a severity, a hold time, per-queue overrides."""

    name: ClassVar[str] = ""
    #: condition rules fire while they hold and resolve; event rules fire once per change
    event: ClassVar[bool] = False
    title: ClassVar[str] = ""

    severity: str = "warning"
    #: seconds the condition must hold before the alert fires
    for_: float = 0.0
    enabled: bool = True
    #: queue -> fields of this rule to change for that queue
    per_queue: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_queue(self, queue: str) -> Rule:
        over = self.per_queue.get(queue)
        if not over:
            return self
        return dataclasses.replace(self, **dict(over), per_queue={})

    def enabled_for(self, queue: str) -> bool:
        return self.for_queue(queue).enabled

    async def check(self, snap: Snapshot, ev: Evaluation) -> list[Finding]:
        """The subjects the condition holds for now."""
        out: list[Finding] = []
        for s in snap.stats:
            rule = self.for_queue(s.queue)
            if rule.enabled:
                f = rule.check_queue(s, snap)
                if f is not None:
                    out.append(f)
        return out

    def check_queue(self, s: QueueStats, snap: Snapshot) -> Finding | None:
        return None

    def describe(self) -> str:
        """One line for ``dumbwaiter alerts rules`` and the dashboard."""
        return self.title

    def promql(self, selector: str) -> str:
        """The Prometheus expression of this rule over ``selector`` (label matchers)."""
        raise NotImplementedError

    def prom_summary(self) -> str:
        return self.title


def _fmt_int(n: float) -> str:
    return f"{int(n):,}"


def _fmt_secs(s: float) -> str:
    """``10 min``, ``1 h``, ``90 s``: thresholds read as people write them."""
    whole = int(s)
    if whole == s and whole >= 3600 and whole % 3600 == 0:
        return f"{whole // 3600} h"
    if whole == s and whole >= 60 and whole % 60 == 0:
        return f"{whole // 60} min"
    if s >= 60:
        return duration(s)
    return f"{s:.3g} s"


@dataclass(frozen=True, kw_only=True)
class QueueDepth(Rule):
    """More than ``threshold`` jobs ready on a queue for ``for_`` seconds."""

    name: ClassVar[str] = "queue_depth"
    title: ClassVar[str] = "queue deeper than a threshold for a while"
    threshold: int = 1000
    for_: float = 600.0

    def check_queue(self, s: QueueStats, snap: Snapshot) -> Finding | None:
        if s.ready <= self.threshold:
            return None
        return Finding(
            s.queue,
            s.ready,
            self.threshold,
            f"queue {s.queue} has {_fmt_int(s.ready)} ready jobs "
            f"(more than {_fmt_int(self.threshold)} for {_fmt_secs(self.for_)})",
        )

    def describe(self) -> str:
        return f"more than {_fmt_int(self.threshold)} ready jobs for {_fmt_secs(self.for_)}"

    def promql(self, selector: str) -> str:
        return f"max by (queue) (dumbwaiter_queue_ready{selector}) > {self.threshold}"

    def prom_summary(self) -> str:
        return "queue {{ $labels.queue }} has {{ $value }} ready jobs"


@dataclass(frozen=True, kw_only=True)
class DeadLetters(Rule):
    """A dead letter was added to a queue since the last evaluation.

    The time of the last pass is kept in the broker per queue, so every
    evaluator looks at the same window: the dead letters that died since
    (``list_jobs`` with ``since``, one page).  Counting is not enough: a
    replayed dead letter that dies again between two passes leaves the count
    as it was.  The first pass on a broker only records the time (older dead
    letters are on the dashboard)."""

    name: ClassVar[str] = "dead_letters"
    event: ClassVar[bool] = True
    title: ClassVar[str] = "dead letter added"
    severity: str = "critical"

    async def check(self, snap: Snapshot, ev: Evaluation) -> list[Finding]:
        queues = [s for s in snap.stats if self.enabled_for(s.queue)]
        seen = await ev.broker.kv_get([SEEN + WATCH, *(SEEN + s.queue for s in queues)])
        # the broker-wide start of the watch: a queue first seen later (it was
        # created since) is watched from then, so its first dead letters count
        started = _mark(seen.get(SEEN + WATCH))
        if started is None:
            await ev.broker.kv_add(SEEN + WATCH, orjson.dumps({"at": snap.at, "floor": snap.at}))
            started = _mark((await ev.broker.kv_get([SEEN + WATCH])).get(SEEN + WATCH))
        watch_floor = started[1] if started is not None else snap.at
        out: list[Finding] = []
        floors: dict[str, float] = {}
        for s in queues:
            mark = _mark(seen.get(SEEN + s.queue))
            if mark is None:
                if watch_floor >= snap.at:
                    floors[s.queue] = snap.at  # the very first look: from now on
                    continue
                mark = (watch_floor, watch_floor)  # a new queue: since the watch began
            last, floor = mark
            floors[s.queue] = floor
            if s.dead == 0:
                continue
            # dead letters that died since the last pass (a few seconds of
            # overlap for clocks and races, never before the first look; the
            # de-duplication key absorbs the overlap)
            page = await ev.broker.list_jobs(
                JobFilter(queue=s.queue, state=State.DEAD, since=max(floor, last - DEAD_OVERLAP)),
                limit=DEAD_PAGE + 1,
            )
            if not page.items:
                continue
            newest = max(page.items, key=lambda i: (i.updated_at or 0.0, i.message.id))
            n = len(page.items)
            count = f"{DEAD_PAGE}+" if n > DEAD_PAGE else str(n)
            out.append(
                Finding(
                    s.queue,
                    s.dead,
                    0,
                    f"{count} dead letter{'s' if n != 1 else ''} added to {s.queue} "
                    f"({_fmt_int(s.dead)} in its dead-letter queue; last: "
                    f"{newest.message.name}, {_last_error(newest)})",
                    change=f"{newest.message.id}:{newest.updated_at or 0.0:.6f}",
                )
            )
        if queues:
            await ev.broker.kv_set(
                {
                    SEEN + q: orjson.dumps({"at": snap.at, "floor": floor})
                    for q, floor in floors.items()
                }
            )
        return out

    def describe(self) -> str:
        return "any dead letter added"

    def promql(self, selector: str) -> str:
        return (
            f"max by (queue) (dumbwaiter_queue_dead{selector})"
            f" > max by (queue) (dumbwaiter_queue_dead{selector} offset 5m)"
        )

    def prom_summary(self) -> str:
        return "dead letters added to {{ $labels.queue }} (now {{ $value }})"


@dataclass(frozen=True, kw_only=True)
class Lag(Rule):
    """The oldest ready job of a queue has waited more than ``threshold`` seconds."""

    name: ClassVar[str] = "lag"
    title: ClassVar[str] = "lag above a threshold"
    threshold: float = 300.0

    def check_queue(self, s: QueueStats, snap: Snapshot) -> Finding | None:
        if s.ready == 0 or s.lag <= self.threshold:
            return None
        return Finding(
            s.queue,
            s.lag,
            self.threshold,
            f"queue {s.queue} lags {_fmt_secs(s.lag)} (its oldest ready job; "
            f"threshold {_fmt_secs(self.threshold)})",
        )

    def describe(self) -> str:
        return f"oldest ready job older than {_fmt_secs(self.threshold)}"

    def promql(self, selector: str) -> str:
        return f"max by (queue) (dumbwaiter_queue_lag_seconds{selector}) > {self.threshold:g}"

    def prom_summary(self) -> str:
        return "queue {{ $labels.queue }} lags {{ $value }} s"


@dataclass(frozen=True, kw_only=True)
class NoWorkers(Rule):
    """Jobs are ready on a queue that is not paused, and no live worker (no
    ``worker:*`` heartbeat) works on it."""

    name: ClassVar[str] = "no_workers"
    title: ClassVar[str] = "no worker heartbeat while jobs are ready"
    severity: str = "critical"
    for_: float = 60.0

    def check_queue(self, s: QueueStats, snap: Snapshot) -> Finding | None:
        if s.ready == 0 or s.paused or snap.workers_on(s.queue):
            return None
        return Finding(
            s.queue,
            s.ready,
            0,
            f"{_fmt_int(s.ready)} jobs are ready on {s.queue} and no live worker works on it",
        )

    def describe(self) -> str:
        return f"jobs ready and no worker heartbeat for {_fmt_secs(self.for_)}"

    def promql(self, selector: str) -> str:
        return (
            f"(max by (queue) (dumbwaiter_queue_ready{selector}) > 0)"
            f" and on (queue) (max by (queue) (dumbwaiter_queue_workers{selector}) == 0)"
            f" and on (queue) (max by (queue) (dumbwaiter_queue_paused{selector}) == 0)"
        )

    def prom_summary(self) -> str:
        return "jobs are ready on {{ $labels.queue }} and no worker works on it"


@dataclass(frozen=True, kw_only=True)
class SchedulerLeader(Rule):
    """A schedule's tick is overdue and no scheduler leader wrote state since.

    Without schedules (or without the scheduler module) it never fires."""

    name: ClassVar[str] = "scheduler_leader"
    title: ClassVar[str] = "scheduler without a leader"
    severity: str = "critical"
    slack: float = SCHEDULER_SLACK

    async def check(self, snap: Snapshot, ev: Evaluation) -> list[Finding]:
        health = snap.scheduler
        if not self.enabled or health is None or health.leader(self.slack):
            return []
        late = health.lateness(self.slack)
        return [
            Finding(
                "scheduler",
                round(late, 3),
                self.slack,
                f"no scheduler leader: {', '.join(health.overdue(self.slack))} overdue by "
                f"{_fmt_secs(round(late))} (run `dumbwaiter scheduler` or a worker "
                "with --with-scheduler)",
            )
        ]

    def describe(self) -> str:
        return f"a schedule's tick overdue by {_fmt_secs(self.slack)} with no leader"

    def promql(self, selector: str) -> str:
        return "min(dumbwaiter_scheduler_leader) == 0"

    def prom_summary(self) -> str:
        return "no scheduler leader: schedules are not run"


RULES: dict[str, type[Rule]] = {
    r.name: r for r in (QueueDepth, DeadLetters, Lag, NoWorkers, SchedulerLeader)
}


def default_rules() -> tuple[Rule, ...]:
    return (QueueDepth(), DeadLetters(), Lag(), NoWorkers(), SchedulerLeader())


def _mark(raw: bytes | None) -> tuple[float, float] | None:
    """(last pass, first look) of a queue's dead-letter watch."""
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
        return float(d["at"]), float(d["floor"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _last_error(info: JobInfo) -> str:
    errors = info.message.errors
    if not errors:
        return "no error recorded"
    e = errors[-1]
    text = f"{e.type}: {e.message}" if e.message else e.type
    return text if len(text) <= 120 else text[:119] + "…"
