"""Alerts: rules over the broker's admin view, sent to the log and to webhooks.

The rules (``default_rules()``, after the practice article's defaults):

* ``queue_depth``: more than ``threshold`` ready jobs for ``for_`` s
  (default 1,000 for 10 minutes);
* ``dead_letters``: a queue's dead-letter count grew since the last pass;
* ``lag``: a queue's oldest ready job is older than ``threshold`` s (5 min);
* ``no_workers``: jobs are ready on a queue (not paused) that no live worker
  works on (no ``worker:*`` heartbeat), for 1 minute;
* ``scheduler_leader``: a schedule's tick is overdue and no leader wrote
  state since.

Each rule takes ``per_queue={"email": {"threshold": 100}, "bulk": {"enabled":
False}}`` to change its fields for some queues.  ``configure(app, ...)``
attaches rules and webhooks to an app; ``AlertService`` evaluates them every
``interval`` s, as a worker side service (``dumbwaiter worker --alerts``,
``Worker(app, services=[AlertService(app)])``) or in the dashboard process.

Any number of processes may evaluate: the broker's ``kv_add`` (first writer
wins, with a TTL) decides which one sends a given notification, and keeps
shared state (since when a condition holds, the dead-letter counts last
seen), so ten workers with ``--alerts`` send one message, not ten.  A firing
alert is repeated every ``repeat`` s while it holds; when it clears, the one
evaluator that deletes its key sends ``resolved``.  ``promrules.prometheus_rules()`` writes
the same rules over the metrics of metrics.py, for those who alert with
Prometheus instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from . import keys
from .brokers.types import JobFilter
from .metrics import SCHEDULER_SLACK, Snapshot, StatsCache
from .redact import mask_url
from .state import State
from .text import duration

if TYPE_CHECKING:
    from .app import App
    from .brokers.base import Broker
    from .brokers.types import JobInfo, QueueStats
    from .worker import Worker

log = logging.getLogger("dumbwaiter.alerts")

KEY = keys.ALERT
PENDING, SENT, ACTIVE, SEEN, HISTORY = (
    KEY + "pending:",
    KEY + "sent:",
    KEY + "active:",
    KEY + "seen-dead:",
    KEY + "history:",
)
#: notifications kept for the dashboard's alerts page
HISTORY_TTL = 7 * 86400.0
#: a dead-letter notification's de-duplication key lives this long: long enough
#: for every evaluator that saw the same change to find it taken
EVENT_DEDUP_TTL = 600.0
#: seconds each dead-letter window overlaps the previous one
DEAD_OVERLAP = 5.0
#: dead letters read per queue and pass (the message says "100+" beyond)
DEAD_PAGE = 100
#: the SEEN key of the broker-wide start of the dead-letter watch
WATCH = "*"

FIRING, RESOLVED = "firing", "resolved"


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule's condition holds for ``subject`` (a queue, or ``scheduler``)."""

    subject: str
    value: float
    threshold: float
    summary: str
    #: part of the de-duplication key of event-like rules (dead letters)
    change: str = ""


@dataclass(frozen=True, slots=True)
class Alert:
    """One notification, as sent to the log and POSTed as JSON to webhooks."""

    rule: str
    subject: str
    status: str
    severity: str
    summary: str
    value: float
    threshold: float
    since: float
    at: float
    app: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "status": self.status,
            "rule": self.rule,
            "subject": self.subject,
            "severity": self.severity,
            "summary": self.summary,
            "value": self.value,
            "threshold": self.threshold,
            "since": self.since,
            "at": self.at,
            "app": self.app,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        return cls(
            rule=str(d.get("rule", "")),
            subject=str(d.get("subject", "")),
            status=str(d.get("status", FIRING)),
            severity=str(d.get("severity", "warning")),
            summary=str(d.get("summary", "")),
            value=float(d.get("value", 0.0)),
            threshold=float(d.get("threshold", 0.0)),
            since=float(d.get("since", 0.0)),
            at=float(d.get("at", 0.0)),
            app=str(d.get("app", "")),
            source=str(d.get("source", "")),
        )


# -- rules ---------------------------------------------------------------------------


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


# -- configuration -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertConfig:
    """What to evaluate, how often, and where to send it."""

    rules: tuple[Rule, ...] = field(default_factory=default_rules)
    #: URLs that get each notification as a JSON POST
    webhooks: tuple[str, ...] = ()
    #: seconds between evaluations
    interval: float = 30.0
    #: seconds before a firing alert is sent again while it holds
    repeat: float = 3600.0
    #: also write notifications to the ``dumbwaiter.alerts`` logger
    log: bool = True
    #: workers evaluate the rules without ``--alerts`` (``--no-alerts`` still stops them)
    in_workers: bool = True

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name and r.enabled), None)


_configs: weakref.WeakKeyDictionary[App, AlertConfig] = weakref.WeakKeyDictionary()


def configure(
    app: App,
    *,
    rules: Sequence[Rule] | None = None,
    webhooks: Sequence[str] = (),
    interval: float = 30.0,
    repeat: float = 3600.0,
    log: bool = True,
    in_workers: bool = True,
) -> AlertConfig:
    """Attach alert rules and webhooks to ``app`` (read by workers, the
    dashboard and ``dumbwaiter doctor``); returns the config.  With
    ``in_workers`` (default) every ``dumbwaiter worker`` evaluates them, as if
    started with ``--alerts``: any number of evaluators send each alert once."""
    cfg = AlertConfig(
        rules=tuple(rules) if rules is not None else default_rules(),
        webhooks=tuple(webhooks),
        interval=interval,
        repeat=repeat,
        log=log,
        in_workers=in_workers,
    )
    _configs[app] = cfg
    return cfg


def config_of(app: App) -> AlertConfig | None:
    """The config ``configure`` attached to ``app``, if any."""
    return _configs.get(app)


#: comma-separated webhook URLs used when the app configures none
WEBHOOKS_ENV = "DUMBWAITER_ALERT_WEBHOOKS"


def effective_config(app: App, webhooks: Sequence[str] = ()) -> AlertConfig:
    """The app's config (or the defaults), with ``webhooks`` and those of
    ``$DUMBWAITER_ALERT_WEBHOOKS`` added: what ``--alerts`` evaluates."""
    import os

    cfg = config_of(app) or AlertConfig()
    extra = [*webhooks, *(u.strip() for u in os.environ.get(WEBHOOKS_ENV, "").split(","))]
    urls = tuple(dict.fromkeys([*cfg.webhooks, *(u for u in extra if u)]))
    return dataclasses.replace(cfg, webhooks=urls)


# -- notifiers -------------------------------------------------------------------------


class Notifier:
    async def send(self, alert: Alert) -> bool:
        """Deliver one notification; False if it could not be delivered."""
        raise NotImplementedError


class LogNotifier(Notifier):
    async def send(self, alert: Alert) -> bool:
        level = logging.INFO if alert.status == RESOLVED else logging.WARNING
        if alert.severity == "critical" and alert.status == FIRING:
            level = logging.ERROR
        log.log(
            level,
            "alert %s %s: %s",
            alert.status,
            alert.rule,
            alert.summary,
            extra={"action": "alert", "alert": alert.to_dict()},
        )
        return True


class WebhookNotifier(Notifier):
    """POST the alert as JSON to ``url`` (Slack-style bridges, Alertmanager
    webhook receivers, PagerDuty Events via a relay...).  The URL is masked in
    logs: webhook URLs often carry their secret in the path or query."""

    def __init__(
        self, url: str, *, timeout: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})

    def _post(self, body: bytes) -> int:
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "dumbwaiter-alerts",
                **self.headers,
            },
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            status: int = resp.status
            return status

    async def send(self, alert: Alert) -> bool:
        body = orjson.dumps(alert.to_dict())
        try:
            status = await asyncio.to_thread(self._post, body)
        except Exception as exc:
            log.error("alert webhook %s failed: %s", mask_url(self.url, path=True), exc)
            return False
        return 200 <= status < 300


# -- evaluation ------------------------------------------------------------------------


@dataclass(slots=True)
class Evaluation:
    """What a rule may use while it checks: the broker and the time."""

    broker: Broker
    now: float


class AlertService:
    """Evaluate an app's alert rules every ``interval`` s and notify.

    ``await service.evaluate()`` runs one pass and returns the notifications
    this process sent; ``await service.run()`` loops; as a worker side service
    it runs with the worker.
    """

    def __init__(
        self,
        app: App,
        config: AlertConfig | None = None,
        *,
        notifiers: Sequence[Notifier] | None = None,
        cache: StatsCache | None = None,
    ) -> None:
        self.app = app
        self.config = config or config_of(app) or AlertConfig()
        if notifiers is None:
            notifiers = [
                *([LogNotifier()] if self.config.log else []),
                *(WebhookNotifier(u) for u in self.config.webhooks),
            ]
        self.notifiers = list(notifiers)
        self.cache = cache or StatsCache(app.broker, min(5.0, self.config.interval))
        self.source = f"{socket.gethostname()}:{_pid()}"

    @property
    def broker(self) -> Broker:
        return self.app.broker

    async def __call__(self, worker: Worker) -> None:
        self.source = worker.id
        await self.run()

    async def run(self) -> None:
        log.info(
            "evaluating %d alert rule(s) every %.0f s",
            len([r for r in self.config.rules if r.enabled]),
            self.config.interval,
        )
        while True:
            try:
                await self.evaluate()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("alert evaluation failed; will try again")
            await asyncio.sleep(self.config.interval)

    async def evaluate(self, now: float | None = None) -> list[Alert]:
        """One pass over every rule; returns the notifications sent by this call."""
        if now is None:
            snap = await self.cache.get()
            now = time.time()
        else:
            snap = await self.cache.refresh(now)
        ev = Evaluation(self.broker, now)
        sent: list[Alert] = []
        for rule in self.config.rules:
            if not rule.enabled:
                continue
            findings = await rule.check(snap, ev)
            if rule.event:
                sent += await self._events(rule, findings, now)
            else:
                subjects = [s.queue for s in snap.stats] + (
                    ["scheduler"] if isinstance(rule, SchedulerLeader) else []
                )
                sent += await self._conditions(rule, findings, subjects, now)
        return sent

    async def _events(self, rule: Rule, findings: list[Finding], now: float) -> list[Alert]:
        sent: list[Alert] = []
        for f in findings:
            alert = self._alert(rule.for_queue(f.subject), f, FIRING, now, now)
            await self.broker.kv_set(
                {f"{ACTIVE}{rule.name}:{f.subject}": orjson.dumps(alert.to_dict())},
                ttl=self.config.repeat,
            )
            key = f"{SENT}{rule.name}:{f.subject}:{f.change}"
            if await self.broker.kv_add(key, b"1", ttl=EVENT_DEDUP_TTL):
                if await self._notify(alert):
                    sent.append(alert)
                else:
                    await self.broker.kv_delete([key])
        return sent

    async def _conditions(
        self, rule: Rule, findings: list[Finding], subjects: list[str], now: float
    ) -> list[Alert]:
        holding = {f.subject: f for f in findings}
        quiet = [s for s in subjects if s not in holding]
        sent: list[Alert] = []
        b = self.broker
        # since when each condition holds: the first evaluator to see it writes the time
        since: dict[str, float] = {}
        if holding:
            for subject in holding:
                await b.kv_add(f"{PENDING}{rule.name}:{subject}", _f(now))
            stored = await b.kv_get([f"{PENDING}{rule.name}:{s}" for s in holding])
            for subject in holding:
                raw = stored.get(f"{PENDING}{rule.name}:{subject}")
                since[subject] = float(raw) if raw is not None else now
        for subject, f in holding.items():
            r = rule.for_queue(subject)
            if now - since[subject] < r.for_:
                continue  # pending
            alert = self._alert(r, f, FIRING, since[subject], now)
            await b.kv_set(
                {f"{ACTIVE}{rule.name}:{subject}": orjson.dumps(alert.to_dict())},
                ttl=max(3 * self.config.interval, 60.0),
            )
            key = f"{SENT}{rule.name}:{subject}"
            if await b.kv_add(key, orjson.dumps(alert.to_dict()), ttl=self.config.repeat):
                if await self._notify(alert):
                    sent.append(alert)
                else:
                    await b.kv_delete([key])  # let the next pass (anywhere) try again
        if quiet:
            await b.kv_delete(
                [f"{PENDING}{rule.name}:{s}" for s in quiet]
                + [f"{ACTIVE}{rule.name}:{s}" for s in quiet]
            )
            was = await b.kv_get([f"{SENT}{rule.name}:{s}" for s in quiet])
            for key, raw in was.items():
                # the one evaluator whose delete removes the key sends "resolved"
                if await b.kv_delete([key]) == 1:
                    fired = Alert.from_dict(orjson.loads(raw))
                    alert = dataclasses.replace(fired, status=RESOLVED, at=now, source=self.source)
                    if await self._notify(alert):
                        sent.append(alert)
        return sent

    def _alert(self, rule: Rule, f: Finding, status: str, since: float, now: float) -> Alert:
        return Alert(
            rule=rule.name,
            subject=f.subject,
            status=status,
            severity=rule.severity,
            summary=f.summary,
            value=float(f.value),
            threshold=float(f.threshold),
            since=since,
            at=now,
            app=mask_url(self.app.url),
            source=self.source,
        )

    async def _notify(self, alert: Alert) -> bool:
        """Send to every notifier; True if every webhook (or, with none, the
        log) took it: a webhook that failed makes the next pass, here or in
        another evaluator, try again.  Kept in the broker's history for the
        dashboard either way."""
        results: list[bool] = []
        for n in self.notifiers:
            try:
                ok = await n.send(alert)
            except Exception:
                log.exception("alert notifier %s failed", type(n).__name__)
                ok = False
            if not isinstance(n, LogNotifier):
                results.append(ok)
        delivered = all(results)
        try:
            await self.broker.kv_set(
                {
                    f"{HISTORY}{alert.at:017.6f}:{alert.rule}:{alert.subject}": orjson.dumps(
                        {**alert.to_dict(), "delivered": delivered}
                    )
                },
                ttl=HISTORY_TTL,
            )
        except Exception:
            log.exception("could not keep the alert in the broker's history")
        return delivered


def _f(x: float) -> bytes:
    return repr(float(x)).encode()


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


def _pid() -> int:
    import os

    return os.getpid()


# -- reading (dashboard, CLI) -----------------------------------------------------------


async def active_alerts(broker: Broker) -> list[Alert]:
    """Alerts firing now (refreshed by the evaluators every pass)."""
    out = [Alert.from_dict(orjson.loads(v)) for v in (await broker.kv_scan(ACTIVE)).values()]
    return sorted(out, key=lambda a: (a.severity != "critical", a.rule, a.subject))


async def history(broker: Broker, limit: int = 100) -> list[dict[str, Any]]:
    """The last notifications (newest first)."""
    items = sorted((await broker.kv_scan(HISTORY)).items(), reverse=True)[:limit]
    return [orjson.loads(v) for _, v in items]
