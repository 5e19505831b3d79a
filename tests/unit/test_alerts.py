"""Alerts: every default rule fires on real brokers and is posted once to a
local webhook, however many evaluators run; per-queue settings; resolution;
the Prometheus rules file."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml  # type: ignore[import-untyped]

import dumbwaiter as dw
from dumbwaiter.alerts import (
    AlertConfig,
    AlertService,
    DeadLetters,
    Lag,
    NoWorkers,
    QueueDepth,
    SchedulerLeader,
    active_alerts,
    configure,
    default_rules,
    history,
)
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.promrules import prometheus_rules, to_yaml
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.brokers import BROKERS


class Webhook:
    """A local HTTP endpoint (127.0.0.1) that records every JSON POST."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.status = 200
        self.arrived = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(orjson.loads(body))
                self.send_response(hook.status)
                self.end_headers()
                hook.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    w = Webhook()
    yield w
    w.close()


@pytest.fixture(params=sorted(BROKERS))
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return BROKERS[request.param](tmp_path)


_apps: list[dw.App] = []


@pytest.fixture(autouse=True)
async def close_apps() -> Any:
    """Close every evaluator's App after the test, passed or failed."""
    yield
    while _apps:
        await _apps.pop().aclose()


def evaluators(url: str, config: AlertConfig, n: int = 2) -> list[AlertService]:
    """``n`` evaluators on one broker, as ``n`` worker processes with --alerts."""
    out = []
    for _ in range(n):
        app = dw.App(url)
        _apps.append(app)
        out.append(AlertService(app, config))
    return out


async def close(services: list[AlertService]) -> None:
    """Kept for readability at the end of tests; ``close_apps`` does the work."""


async def run_all(services: list[AlertService], now: float | None = None) -> list[Any]:
    """One pass of every evaluator at ``now`` (default: the present; either way
    each reads the broker afresh instead of its cached snapshot)."""
    sent = []
    for s in services:
        sent += await s.evaluate(time.time() if now is None else now)
    return sent


def rules_only(*rules: Any, webhook: Webhook) -> AlertConfig:
    return AlertConfig(rules=tuple(rules), webhooks=(webhook.url,), log=True)


async def test_queue_depth_fires_after_holding_and_resolves_once(
    broker_url: str, webhook: Webhook
) -> None:
    app = dw.App(broker_url)

    @app.task(queue="bulk")
    def item(i: int) -> None: ...

    try:
        await item.aenqueue_many([(i,) for i in range(6)])
        cfg = rules_only(QueueDepth(threshold=5, for_=600), webhook=webhook)
        services = evaluators(broker_url, cfg)
        t0 = time.time()
        assert await run_all(services, t0) == []  # pending: holds for 0 of 600 s
        assert await run_all(services, t0 + 300) == []
        sent = await run_all(services, t0 + 601)
        assert [(a.rule, a.subject, a.status) for a in sent] == [("queue_depth", "bulk", "firing")]
        assert len(webhook.received) == 1
        body = webhook.received[0]
        assert body["rule"] == "queue_depth" and body["subject"] == "bulk"
        assert body["value"] == 6 and body["threshold"] == 5
        assert body["since"] == pytest.approx(t0, abs=0.01)
        assert "6 ready jobs" in body["summary"]
        # still holding: not sent again before `repeat`
        assert await run_all(services, t0 + 700) == []
        assert [a.subject for a in await active_alerts(services[0].broker)] == ["bulk"]
        # cleared: exactly one evaluator sends "resolved"
        await app.broker.purge(JobFilter(queue="bulk"))
        sent = await run_all(services, t0 + 800)
        assert [(a.rule, a.status) for a in sent] == [("queue_depth", "resolved")]
        assert [b["status"] for b in webhook.received] == ["firing", "resolved"]
        assert await active_alerts(services[0].broker) == []
        kept = await history(services[0].broker)
        assert [h["status"] for h in kept] == ["resolved", "firing"]
        await close(services)
    finally:
        await app.aclose()


async def test_dead_letter_added_fires_once(broker_url: str, webhook: Webhook) -> None:
    app = dw.App(broker_url, retry=dw.Retry.never())

    @app.task(queue="mail")
    def send() -> None:
        raise ConnectionError("smtp down")

    try:
        cfg = rules_only(DeadLetters(), webhook=webhook)
        services = evaluators(broker_url, cfg, n=3)
        await send.aenqueue()
        await drain(app)  # the first dead letter predates the watch: recorded, not sent
        assert await run_all(services) == []
        await send.aenqueue()
        await send.aenqueue()
        await drain(app)
        sent = await run_all(services)
        assert [(a.rule, a.subject, a.severity) for a in sent] == [
            ("dead_letters", "mail", "critical")
        ]
        assert len(webhook.received) == 1
        assert webhook.received[0]["value"] == 3
        assert "2 dead letters added to mail" in webhook.received[0]["summary"]
        assert "ConnectionError: smtp down" in webhook.received[0]["summary"]
        assert await run_all(services) == []  # nothing new
        # replayed and dead again before the next pass: the count is the same,
        # but these dead letters are new
        await app.broker.replay(JobFilter(queue="mail", state=State.DEAD))
        await drain(app)
        sent = await run_all(services)
        assert len(sent) == 1 and len(webhook.received) == 2
        await close(services)
    finally:
        await app.aclose()


async def test_dead_letters_of_a_queue_created_after_the_watch_began(
    broker_url: str, webhook: Webhook
) -> None:
    app = dw.App(broker_url, retry=dw.Retry.never())

    @app.task(queue="brand-new")
    def fails() -> None:
        raise KeyError("missing")

    try:
        services = evaluators(broker_url, rules_only(DeadLetters(), webhook=webhook))
        assert await run_all(services) == []  # the watch begins; no queue exists yet
        await fails.aenqueue()
        await drain(app)
        sent = await run_all(services)
        assert [(a.rule, a.subject) for a in sent] == [("dead_letters", "brand-new")]
        assert len(webhook.received) == 1
    finally:
        await app.aclose()


async def test_lag_above_threshold_fires(broker_url: str, webhook: Webhook) -> None:
    app = dw.App(broker_url)

    @app.task(queue="reports")
    def build() -> None: ...

    try:
        # any lag at all is over a threshold of 0 (lag counts from when a job
        # became ready, which a test cannot move back without waiting)
        await build.aenqueue()
        cfg = rules_only(Lag(threshold=0), webhook=webhook)
        services = evaluators(broker_url, cfg)
        sent = await run_all(services)
        assert [(a.rule, a.subject) for a in sent] == [("lag", "reports")]
        assert webhook.received[0]["value"] > 0
        assert "reports lags" in webhook.received[0]["summary"]
        assert len(webhook.received) == 1
        # a per-queue threshold above the lag: nothing fires for that queue
        quiet = rules_only(
            Lag(threshold=0, per_queue={"reports": {"threshold": 600}}), webhook=webhook
        )
        other_app = dw.App(broker_url)
        _apps.append(other_app)
        other = AlertService(other_app, quiet)
        sent = await other.evaluate(time.time())
        assert [(a.rule, a.status) for a in sent] == [("lag", "resolved")]
        await close([*services, other])
    finally:
        await app.aclose()


async def test_no_worker_while_jobs_are_ready(broker_url: str, webhook: Webhook) -> None:
    app = dw.App(broker_url)

    @app.task(queue="orphans")
    def job() -> None: ...

    try:
        await job.aenqueue()
        cfg = rules_only(NoWorkers(for_=0), webhook=webhook)
        services = evaluators(broker_url, cfg)
        sent = await run_all(services)
        assert [(a.rule, a.subject) for a in sent] == [("no_workers", "orphans")]
        assert len(webhook.received) == 1
        assert "no live worker" in webhook.received[0]["summary"]
        # a live worker on the queue (its heartbeat in the kv store) clears it
        started, stop = threading.Event(), threading.Event()
        worker = dw.Worker(app, queues=("orphans",), heartbeat=0.05, lease=1.0)

        @app.task(queue="orphans")
        def block() -> None:
            started.set()
            stop.wait(10)

        await block.aenqueue()
        import asyncio

        run = asyncio.create_task(worker.run())
        try:
            # running: the worker announced itself before it fetched
            assert await asyncio.to_thread(started.wait, 10)
            sent = await run_all(services)
            assert [(a.rule, a.status) for a in sent] == [("no_workers", "resolved")]
        finally:
            stop.set()
            worker.stop()
            await run
        assert [b["status"] for b in webhook.received] == ["firing", "resolved"]
        await close(services)
    finally:
        await app.aclose()


async def test_scheduler_without_a_leader(broker_url: str, webhook: Webhook) -> None:
    from dumbwaiter.scheduler import Scheduler

    app = dw.App(broker_url)

    @app.periodic(every=timedelta(seconds=10))
    def ping() -> None: ...

    try:
        cfg = rules_only(SchedulerLeader(), webhook=webhook)
        services = evaluators(broker_url, cfg)
        assert await run_all(services) == []  # no schedule state yet: nothing to say
        leader = Scheduler(app, lease=5)
        await leader.step()  # elected; records the schedule and its next tick
        await leader.resign()
        now = time.time()
        assert await run_all(services, now) == []  # the next tick is not due yet
        assert await run_all(services, now + 30) == []  # due, within the slack
        sent = await run_all(services, now + 200)  # overdue and nobody ran it
        assert [(a.rule, a.subject) for a in sent] == [("scheduler_leader", "scheduler")]
        assert len(webhook.received) == 1
        assert "ping" in webhook.received[0]["summary"]
        await close(services)
    finally:
        await app.aclose()


async def test_scheduler_rule_tolerates_no_scheduler_module(
    monkeypatch: pytest.MonkeyPatch, webhook: Webhook
) -> None:
    monkeypatch.setitem(sys.modules, "dumbwaiter.scheduler", None)
    app = dw.App("memory://")
    service = AlertService(app, rules_only(SchedulerLeader(), webhook=webhook))
    assert await service.evaluate() == []
    assert (await service.cache.get()).scheduler is None


async def test_failed_webhook_is_retried_by_the_next_pass(webhook: Webhook) -> None:
    app = dw.App("memory://")

    @app.task(queue="q")
    def job() -> None: ...

    await job.aenqueue()
    webhook.status = 500
    service = AlertService(app, rules_only(NoWorkers(for_=0), webhook=webhook))
    assert await service.evaluate(time.time()) == []  # not delivered: the key is released
    webhook.status = 200
    sent = await service.evaluate(time.time())
    assert len(sent) == 1 and len(webhook.received) == 2
    assert [h["delivered"] for h in await history(app.broker)] == [True, False]


async def test_webhook_url_secrets_stay_out_of_logs(caplog: pytest.LogCaptureFixture) -> None:
    from dumbwaiter.alerts import Alert, WebhookNotifier

    n = WebhookNotifier("http://127.0.0.1:9/services/T000/SECRET-PATH?token=hunter2", timeout=1)
    alert = Alert("lag", "q", "firing", "warning", "x", 1, 0, 0, 0)
    assert await n.send(alert) is False
    assert "SECRET-PATH" not in caplog.text and "hunter2" not in caplog.text
    assert "127.0.0.1:9" in caplog.text


def test_per_queue_overrides() -> None:
    rule = QueueDepth(
        threshold=1000, per_queue={"bulk": {"threshold": 50_000}, "x": {"enabled": False}}
    )
    assert rule.for_queue("bulk").threshold == 50_000  # type: ignore[attr-defined]
    assert rule.for_queue("mail").threshold == 1000  # type: ignore[attr-defined]
    assert not rule.enabled_for("x")
    with pytest.raises(TypeError):
        QueueDepth(per_queue={"q": {"treshold": 1}}).for_queue("q")


def test_configure_attaches_to_the_app() -> None:
    app = dw.App("memory://")
    assert dw_config(app) is None
    cfg = configure(app, webhooks=["http://127.0.0.1:1/x"])
    assert dw_config(app) is cfg
    assert [r.name for r in cfg.rules] == [r.name for r in default_rules()]


def dw_config(app: dw.App) -> AlertConfig | None:
    from dumbwaiter.alerts import config_of

    return config_of(app)


def test_prometheus_rules_file() -> None:
    cfg = AlertConfig(
        rules=(
            QueueDepth(per_queue={"bulk": {"threshold": 50_000}, "noisy": {"enabled": False}}),
            DeadLetters(),
            Lag(threshold=120),
            NoWorkers(),
            SchedulerLeader(),
        )
    )
    doc = yaml.safe_load(to_yaml(prometheus_rules(cfg)))
    [group] = doc["groups"]
    assert group["name"] == "dumbwaiter"
    rules = group["rules"]
    by_alert: dict[str, list[dict[str, Any]]] = {}
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}
        assert r["labels"]["severity"] in ("warning", "critical")
        by_alert.setdefault(r["alert"], []).append(r)
    assert sorted(by_alert) == [
        "DumbwaiterDeadLetters",
        "DumbwaiterLag",
        "DumbwaiterNoWorkers",
        "DumbwaiterQueueDepth",
        "DumbwaiterSchedulerLeader",
    ]
    depth_all, depth_bulk = by_alert["DumbwaiterQueueDepth"]
    assert depth_all["expr"] == (
        'max by (queue) (dumbwaiter_queue_ready{queue!~"bulk|noisy"}) > 1000'
    )
    assert depth_all["for"] == "10m"
    assert depth_bulk["expr"] == 'max by (queue) (dumbwaiter_queue_ready{queue="bulk"}) > 50000'
    assert by_alert["DumbwaiterLag"][0]["expr"].endswith("> 120")
    assert "offset 5m" in by_alert["DumbwaiterDeadLetters"][0]["expr"]
    assert by_alert["DumbwaiterSchedulerLeader"][0]["expr"] == (
        "min(dumbwaiter_scheduler_leader) == 0"
    )
    assert "dumbwaiter_queue_workers" in by_alert["DumbwaiterNoWorkers"][0]["expr"]
    assert by_alert["DumbwaiterNoWorkers"][0]["for"] == "1m"
    # every metric the rules use is in the catalogue
    import re

    from dumbwaiter.metrics import BY_NAME

    used = {m for r in rules for m in re.findall(r"dumbwaiter_[a-z_]+", r["expr"])}
    assert used <= set(BY_NAME)


def test_alerts_rules_cli_writes_the_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dumbwaiter.cli import main

    out = tmp_path / "rules.yml"
    result = CliRunner().invoke(
        main, ["alerts", "rules", "--prometheus", "-o", str(out), "--url", "memory://"]
    )
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert len(doc["groups"][0]["rules"]) == 5
    table = CliRunner().invoke(main, ["alerts", "rules", "--url", "memory://"])
    assert table.exit_code == 0 and "queue_depth" in table.output


def test_alerts_check_cli_exits_1_when_firing(tmp_path: Path) -> None:
    import asyncio

    from click.testing import CliRunner

    from dumbwaiter.cli import main

    url = f"sqlite:///{tmp_path}/c.db"
    runner = CliRunner(env={"DUMBWAITER_ALERT_WEBHOOKS": "", "DUMBWAITER_URL": url})
    assert runner.invoke(main, ["alerts", "check", "--url", url]).exit_code == 0

    async def late_job() -> None:
        app = dw.App(url)

        @app.task(queue="stuck")
        def slow() -> None: ...

        await slow.aenqueue()
        await app.aclose()

    asyncio.run(late_job())
    spec = "tests.apps.lagapp:app"
    r = runner.invoke(main, ["alerts", "check", "--app", spec, "--json"])
    assert r.exit_code == 1, r.output
    firing = orjson.loads(r.stdout)["firing"]
    assert [(a["rule"], a["subject"]) for a in firing] == [("lag", "stuck")]
