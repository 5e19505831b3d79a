"""Metrics: the middleware's counters and histograms, the queue gauges, the
worker's /metrics server, and the catalogue against docs/metrics.md."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

import dumbwaiter as dw
from dumbwaiter.metrics import (
    CATALOGUE,
    MetricsServer,
    PrometheusMiddleware,
    StatsCache,
    register_collector,
)
from dumbwaiter.testing import drain

FAST = dw.Retry(attempts=2, backoff=0.01, jitter=0)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


async def test_counters_and_histograms_follow_each_outcome(registry: CollectorRegistry) -> None:
    app = dw.App("memory://", retry=FAST, middleware=[PrometheusMiddleware(registry)])

    @app.task(queue="mail")
    def ok(x: int) -> int:
        return x

    @app.task(queue="mail")
    def broken() -> None:
        raise ValueError("no")

    await ok.aenqueue(1)
    await ok.aenqueue(2)
    await broken.aenqueue()
    await ok.options(key="same").aenqueue(3)
    await ok.options(key="same").aenqueue(3)  # duplicate key: nothing stored, not counted
    await drain(app)

    ok_l = {"queue": "mail", "task": ok.name}
    bad_l = {"queue": "mail", "task": broken.name}
    assert value(registry, "dumbwaiter_jobs_enqueued_total", **ok_l) == 3
    assert value(registry, "dumbwaiter_jobs_enqueued_total", **bad_l) == 1
    assert value(registry, "dumbwaiter_jobs_started_total", **ok_l) == 3
    assert value(registry, "dumbwaiter_jobs_started_total", **bad_l) == 2  # two attempts
    assert value(registry, "dumbwaiter_jobs_succeeded_total", **ok_l) == 3
    assert value(registry, "dumbwaiter_jobs_succeeded_total", **bad_l) == 0
    assert value(registry, "dumbwaiter_jobs_retried_total", **bad_l) == 1
    assert value(registry, "dumbwaiter_jobs_dead_total", **bad_l) == 1
    # every attempt is timed; only first starts of new jobs count as queue wait
    assert value(registry, "dumbwaiter_job_run_seconds_count", **bad_l) == 2
    assert value(registry, "dumbwaiter_job_wait_seconds_count", **bad_l) == 1
    assert value(registry, "dumbwaiter_job_wait_seconds_count", **ok_l) == 3
    assert value(registry, "dumbwaiter_job_run_seconds_sum", **ok_l) >= 0


async def test_workflow_runs_and_steps_are_counted_and_timed(registry: CollectorRegistry) -> None:
    app = dw.App("memory://", retry=FAST, middleware=[PrometheusMiddleware(registry)])
    tries: list[int] = []

    def flaky() -> int:
        tries.append(1)
        if len(tries) == 1:
            raise TimeoutError("slow")
        return len(tries)

    @app.workflow(name="m.ok")
    def ok(ctx: dw.WorkflowContext) -> int:
        return ctx.step("flaky", flaky)

    @app.workflow(name="m.bad")
    def bad(ctx: dw.WorkflowContext) -> None:
        ctx.step("boom", _boom, retry=False)

    await ok.aenqueue()
    await ok.aenqueue()
    await bad.aenqueue()
    await drain(app)
    assert value(registry, "dumbwaiter_workflow_runs_total", workflow="m.ok", status="started") == 2
    assert (
        value(registry, "dumbwaiter_workflow_runs_total", workflow="m.ok", status="succeeded") == 2
    )
    assert value(registry, "dumbwaiter_workflow_runs_total", workflow="m.bad", status="failed") == 1
    step = {"workflow": "m.ok", "step": "flaky"}
    assert value(registry, "dumbwaiter_workflow_step_seconds_count", **step) == 3  # 1 retry
    assert value(registry, "dumbwaiter_workflow_step_failures_total", **step) == 1
    boom = {"workflow": "m.bad", "step": "boom"}
    assert value(registry, "dumbwaiter_workflow_step_failures_total", **boom) == 1


def _boom() -> None:
    raise ValueError("boom")


async def test_queue_wait_starts_at_the_eta(registry: CollectorRegistry) -> None:
    app = dw.App("memory://", middleware=[PrometheusMiddleware(registry)])

    @app.task
    def later() -> None: ...

    # due a second after its creation: measured from creation, its wait would
    # be a second at least; measured from the eta, it is the worker's pickup
    await later.options(eta=time.time() + 1.0).aenqueue()
    await drain(app)
    labels = {"queue": "default", "task": later.name}
    assert value(registry, "dumbwaiter_job_wait_seconds_count", **labels) == 1
    # the 0.5 s bucket holds it: the second before the eta is not counted
    assert value(registry, "dumbwaiter_job_wait_seconds_bucket", le="0.5", **labels) == 1


async def test_published_events_are_counted_by_type(registry: CollectorRegistry) -> None:
    app = dw.App("memory://", middleware=[PrometheusMiddleware(registry)])

    class Paid(dw.Event, type="metrics.paid"):
        order: str

    got: list[str] = []

    @app.subscribe(Paid, group="books")
    def book(event: Paid) -> None:
        got.append(event.order)

    await app.apublish(Paid(order="o-1"))
    await drain(app)
    assert got == ["o-1"]
    assert value(registry, "dumbwaiter_events_published_total", event="metrics.paid") == 1
    labels = {"queue": "group:books", "task": "metrics.paid"}
    assert value(registry, "dumbwaiter_jobs_succeeded_total", **labels) == 1


async def test_two_middleware_on_one_registry_share_the_metrics(
    registry: CollectorRegistry,
) -> None:
    a, b = PrometheusMiddleware(registry), PrometheusMiddleware(registry)
    assert a.m is b.m


async def test_gauges_come_from_the_cached_snapshot(registry: CollectorRegistry) -> None:
    app = dw.App("memory://", retry=dw.Retry.never())

    @app.task(queue="q1")
    def fails() -> None:
        raise RuntimeError("x")

    @app.task(queue="q2")
    def waits() -> None: ...

    await fails.aenqueue()
    await drain(app, ["q1"])
    for _ in range(3):
        await waits.aenqueue()
    await waits.options(delay=3600).aenqueue()
    cache = StatsCache(app.broker, interval=60)
    register_collector(registry, cache)
    assert value(registry, "dumbwaiter_queue_ready", queue="q2") == 0  # nothing read yet
    await cache.refresh()
    assert value(registry, "dumbwaiter_queue_ready", queue="q2") == 3
    assert value(registry, "dumbwaiter_queue_scheduled", queue="q2") == 1
    assert value(registry, "dumbwaiter_queue_dead", queue="q1") == 1
    assert value(registry, "dumbwaiter_queue_lag_seconds", queue="q2") >= 0
    assert value(registry, "dumbwaiter_queue_workers", queue="q2") == 0
    assert value(registry, "dumbwaiter_workers") == 0
    await waits.aenqueue()
    # a scrape reads the snapshot: no broker call, so the new job is not seen yet
    assert value(registry, "dumbwaiter_queue_ready", queue="q2") == 3
    assert (await cache.get()).queue("q2").ready == 3  # type: ignore[union-attr]
    await cache.get(max_age=0)
    assert value(registry, "dumbwaiter_queue_ready", queue="q2") == 4


async def test_gauges_tell_running_jobs_from_prefetched_ones(registry: CollectorRegistry) -> None:
    """Of 3 leased jobs, the worker's heartbeat says 2 wait in its buffer."""
    app = dw.App("memory://")

    @app.task(queue="q")
    def job(n: int) -> None: ...

    await job.aenqueue_many(range(4))
    assert len(await app.broker.fetch(["q"], 3, 60.0, 0, "w1")) == 3
    record = {"id": "w1", "queues": ["q"], "prefetched": {"q": 2, "other": 5}}
    await app.broker.kv_set({"worker:w1": orjson.dumps(record)}, ttl=60)
    cache = StatsCache(app.broker, interval=60)
    register_collector(registry, cache)
    await cache.refresh()
    assert value(registry, "dumbwaiter_queue_running", queue="q") == 1
    assert value(registry, "dumbwaiter_queue_prefetched", queue="q") == 2
    assert value(registry, "dumbwaiter_queue_ready", queue="q") == 1
    # a stale heartbeat that claims more than is leased never makes running negative
    record["prefetched"] = {"q": 9}
    await app.broker.kv_set({"worker:w1": orjson.dumps(record)}, ttl=60)
    await cache.refresh()
    assert value(registry, "dumbwaiter_queue_running", queue="q") == 0
    assert value(registry, "dumbwaiter_queue_prefetched", queue="q") == 3


async def test_worker_serves_metrics_on_loopback(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    app = dw.App(f"sqlite:///{tmp_path}/m.db")

    @app.task
    def hello() -> None: ...

    server = MetricsServer(app, port=0, registry=registry, interval=0.05)
    port = server.start()
    try:
        await hello.aenqueue()
        await drain(app)
        await server.cache.refresh()
        body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    finally:
        server.stop()
        await app.aclose()
    text = body.decode()
    assert f'dumbwaiter_jobs_succeeded_total{{queue="default",task="{hello.name}"}} 1.0' in text
    assert 'dumbwaiter_queue_ready{queue="default"} 0.0' in text
    assert "dumbwaiter_stats_age_seconds" in text


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
        return body


def test_catalogue_is_documented() -> None:
    """docs/metrics.md lists exactly the catalogue's names."""
    import re

    documented = set(re.findall(r"`(dumbwaiter_[a-z_]+)`", DOCS.read_text()))
    assert documented == {m.name for m in CATALOGUE}


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(dw.MissingDependency, match=r"pip install 'dumbwaiter\[metrics\]'"):
        PrometheusMiddleware(CollectorRegistry())


async def test_worker_options_install_metrics_and_alerts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dumbwaiter worker --metrics-port/--alerts`` add these side services."""
    from dumbwaiter.alerts import AlertService, configure
    from dumbwaiter.cli.worker import _observability
    from dumbwaiter.metrics import port_for_process

    app = dw.App(f"sqlite:///{tmp_path}/w.db")

    @app.task
    def hello() -> None: ...

    assert _observability(app, None, "127.0.0.1", None) == []  # nothing asked, nothing configured
    [alerts] = _observability(app, None, "127.0.0.1", True)
    assert isinstance(alerts, AlertService)
    configure(app)  # a configured app evaluates in every worker...
    assert [type(s) for s in _observability(app, None, "127.0.0.1", None)] == [AlertService]
    assert _observability(app, None, "127.0.0.1", False) == []  # ...unless --no-alerts
    [server, _] = _observability(app, 0, "127.0.0.1", None)
    assert isinstance(server, MetricsServer)
    try:
        assert any(isinstance(m, PrometheusMiddleware) for m in app.middleware.middleware)
        port = server._server.server_address[1]
        await server.cache.refresh()
        body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert b"dumbwaiter_workers" in body
    finally:
        server.stop()
        await app.aclose()
    monkeypatch.setenv("DUMBWAITER_PROCESS_INDEX", "3")
    assert port_for_process(9464) == 9467
