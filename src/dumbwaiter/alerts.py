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

This module configures and evaluates; the rules live in alert_rules.py and
the notifications with their notifiers in alert_notify.py, and every public
name of the three is importable from here (``__all__``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from . import keys
from .alert_notify import FIRING, RESOLVED, Alert, LogNotifier, Notifier, WebhookNotifier
from .alert_rules import (
    RULES,
    DeadLetters,
    Evaluation,
    Finding,
    Lag,
    NoWorkers,
    QueueDepth,
    Rule,
    SchedulerLeader,
    default_rules,
)
from .metrics import StatsCache
from .redact import mask_url

if TYPE_CHECKING:
    from .app import App
    from .brokers.base import Broker
    from .worker import Worker

__all__ = [
    "FIRING",
    "RESOLVED",
    "RULES",
    "WEBHOOKS_ENV",
    "Alert",
    "AlertConfig",
    "AlertService",
    "DeadLetters",
    "Evaluation",
    "Finding",
    "Lag",
    "LogNotifier",
    "NoWorkers",
    "Notifier",
    "QueueDepth",
    "Rule",
    "SchedulerLeader",
    "WebhookNotifier",
    "active_alerts",
    "config_of",
    "configure",
    "default_rules",
    "effective_config",
    "history",
]

log = logging.getLogger("dumbwaiter.alerts")

KEY = keys.ALERT
PENDING, SENT, ACTIVE, HISTORY = (
    KEY + "pending:",
    KEY + "sent:",
    KEY + "active:",
    KEY + "history:",
)
#: notifications kept for the dashboard's alerts page
HISTORY_TTL = 7 * 86400.0
#: a dead-letter notification's de-duplication key lives this long: long enough
#: for every evaluator that saw the same change to find it taken
EVENT_DEDUP_TTL = 600.0

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


# -- evaluation ------------------------------------------------------------------------


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
