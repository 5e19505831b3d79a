"""Metrics: the one catalogue of metric names, the Prometheus middleware, and
the collector of queue gauges.

Two kinds of numbers, measured in two places:

* **What happens** (counters and histograms): ``PrometheusMiddleware`` counts
  enqueues, starts, successes, retries, dead letters and rescues in the process
  where they happen, and times each attempt (run time) and each new job's wait
  for a worker (queue wait).  Each worker exports its own; Prometheus sums them.
* **What is stored** (gauges): ready, scheduled, retrying, running, prefetched,
  dead, lag, paused, and the scaling signal (desired workers, backlog per
  worker: scaling.py) per queue and subscriber group (``group:NAME``), live workers, and
  whether the scheduler has a leader, read from the broker's admin API by a
  ``QueueCollector``.  A scrape never touches the broker: ``StatsCache`` keeps
  the last snapshot and refreshes it at most every ``interval`` seconds (on
  SQLite ``stats()`` counts every stored job, which must not happen per scrape).

``CATALOGUE`` lists every name exactly as Prometheus shows it; docs/metrics.md
is the same table for people, and a test keeps the two in step.

prometheus-client is an optional dependency (``pip install
'dumbwaiter[metrics]'``): this module imports it only when a middleware,
collector or server is made, so the catalogue and ``StatsCache`` (which the
dashboard and the alerts use) work without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from . import keys
from .errors import MissingDependency
from .middleware import Middleware
from .scaling import scales
from .throughput import record_sample

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .app import App
    from .brokers.base import Broker
    from .brokers.types import QueueStats
    from .context import Context
    from .message import ErrorRecord, Message
    from .worker import Worker

log = logging.getLogger("dumbwaiter.metrics")

COUNTER, HISTOGRAM, GAUGE = "counter", "histogram", "gauge"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name as exposed, its type, its labels, what it means."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    #: ``middleware`` (counted where it happens) or ``collector`` (read from the broker)
    source: str

    @property
    def base(self) -> str:
        """The name prometheus-client is given (it adds ``_total`` to counters)."""
        return self.name.removesuffix("_total") if self.kind == COUNTER else self.name


_JOB = ("queue", "task")

#: Every metric dumbwaiter exports.  ``task`` is the task name, or the event
#: type for a subscriber group's delivery; a group's queue is ``group:NAME``.
CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(
        "dumbwaiter_jobs_enqueued_total", COUNTER, _JOB, "Jobs stored by enqueue.", "middleware"
    ),
    MetricSpec(
        "dumbwaiter_events_published_total",
        COUNTER,
        ("event",),
        "Events published (before fan-out to groups).",
        "middleware",
    ),
    MetricSpec("dumbwaiter_jobs_started_total", COUNTER, _JOB, "Attempts started.", "middleware"),
    MetricSpec(
        "dumbwaiter_jobs_succeeded_total", COUNTER, _JOB, "Attempts that succeeded.", "middleware"
    ),
    MetricSpec(
        "dumbwaiter_jobs_retried_total",
        COUNTER,
        _JOB,
        "Failed attempts that will be tried again.",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_jobs_dead_total",
        COUNTER,
        _JOB,
        "Jobs moved to the dead-letter queue by this worker or its rescuer.",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_jobs_rescued_total",
        COUNTER,
        (),
        "Jobs of lost workers given back by this worker's rescuer.",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_job_run_seconds",
        HISTOGRAM,
        _JOB,
        "Run time of one attempt (handler and middleware).",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_job_wait_seconds",
        HISTOGRAM,
        _JOB,
        "Queue wait of a new job: from enqueue (or its eta, if later) to its first start.",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_workflow_runs_total",
        COUNTER,
        ("workflow", "status"),
        "Durable workflow runs by what happened: started, succeeded, failed, cancelled, retried.",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_workflow_step_seconds",
        HISTOGRAM,
        ("workflow", "step"),
        "Run time of one attempt of a durable workflow step (or compensation).",
        "middleware",
    ),
    MetricSpec(
        "dumbwaiter_workflow_step_failures_total",
        COUNTER,
        ("workflow", "step"),
        "Failed attempts of durable workflow steps (retried or final).",
        "middleware",
    ),
    MetricSpec("dumbwaiter_queue_ready", GAUGE, ("queue",), "Jobs ready to run.", "collector"),
    MetricSpec(
        "dumbwaiter_queue_scheduled",
        GAUGE,
        ("queue",),
        "Jobs waiting for their eta (retries not included).",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_retrying",
        GAUGE,
        ("queue",),
        "Jobs that failed and wait for their next attempt.",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_running",
        GAUGE,
        ("queue",),
        "Jobs a worker's handler is running.",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_prefetched",
        GAUGE,
        ("queue",),
        "Jobs leased by a worker and waiting in its buffer for a free slot "
        "(as of the worker's last heartbeat).",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_dead", GAUGE, ("queue",), "Jobs in the dead-letter queue.", "collector"
    ),
    MetricSpec(
        "dumbwaiter_queue_lag_seconds",
        GAUGE,
        ("queue",),
        "Age of the oldest ready job (0 when none is ready).",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_paused", GAUGE, ("queue",), "1 while the queue is paused.", "collector"
    ),
    MetricSpec(
        "dumbwaiter_queue_workers",
        GAUGE,
        ("queue",),
        "Live workers (heartbeat within two leases) that work on the queue.",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_desired_workers",
        GAUGE,
        ("queue",),
        "Workers the queue needs now: its busy slots plus the slots that clear its ready "
        "jobs within the drain target, over the workers' concurrency (scaling.py); "
        "an autoscaler's target.",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_queue_backlog_per_worker",
        GAUGE,
        ("queue",),
        "Jobs ready, prefetched or running per live worker on the queue (all of them "
        "when no worker lives).",
        "collector",
    ),
    MetricSpec("dumbwaiter_workers", GAUGE, (), "Live workers.", "collector"),
    MetricSpec(
        "dumbwaiter_scheduler_leader",
        GAUGE,
        (),
        "1 while schedules are run on time, 0 when a tick is overdue (no leader); "
        "absent when no schedule is known.",
        "collector",
    ),
    MetricSpec(
        "dumbwaiter_stats_age_seconds",
        GAUGE,
        (),
        "Age of the broker snapshot the gauges come from.",
        "collector",
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOGUE}

#: histogram buckets (seconds): attempts are short, waits can be long
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)

#: seconds a broker snapshot is reused before the next refresh
DEFAULT_INTERVAL = 5.0


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingDependency(
            "metrics need prometheus-client, which is not installed: "
            "pip install 'dumbwaiter[metrics]'"
        ) from exc
    return prometheus_client


# -- what is stored: snapshots of the admin API --------------------------------------


@dataclass(frozen=True, slots=True)
class SchedulerHealth:
    """What the schedules' state in the broker says about the scheduler leader.

    The leader rewrites a schedule's state (``next_tick``, ``updated_at``)
    whenever it enqueues one of its ticks.  A tick that is past, and newer
    than every state any leader wrote, has not been run by a leader.  (A
    schedule removed from the code keeps its last state; it does not count
    while any other schedule's state is newer than its tick.)
    """

    schedules: int
    #: schedule -> seconds its unrun tick is late
    late: Mapping[str, float] = field(default_factory=dict)

    def overdue(self, slack: float = 0.0) -> list[str]:
        """Schedules late by more than ``slack`` s (a new leader takes over
        within one lease, and a tick may be late by its grace)."""
        return sorted(n for n, late in self.late.items() if late > slack)

    def lateness(self, slack: float = 0.0) -> float:
        return max((late for late in self.late.values() if late > slack), default=0.0)

    def leader(self, slack: float = 0.0) -> bool:
        return not self.overdue(slack)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The admin API's view at one moment: queues, live workers, scheduler."""

    at: float
    stats: tuple[QueueStats, ...]
    workers: tuple[dict[str, Any], ...]
    scheduler: SchedulerHealth | None = None

    def workers_on(self, queue: str) -> int:
        return sum(1 for w in self.workers if queue in (w.get("queues") or ()))

    def queue(self, name: str) -> QueueStats | None:
        return next((s for s in self.stats if s.queue == name), None)


#: slack before an overdue schedule tick counts as "no leader": a new leader
#: takes over within one lease (15 s) and a tick may be late by its grace
SCHEDULER_SLACK = 90.0


async def scheduler_health(broker: Broker, now: float) -> SchedulerHealth | None:
    """``SchedulerHealth`` from the schedules' state, or None where no schedule
    exists."""
    states: dict[str, dict[str, Any]] = {}
    for key, raw in (await broker.kv_scan(keys.SCHEDULE)).items():
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            states[key[len(keys.SCHEDULE) :]] = value
    if not states:
        return None
    newest = max((_num(s.get("updated_at")) or 0.0) for s in states.values())
    late: dict[str, float] = {}
    for name, s in states.items():
        tick = _num(s.get("next_tick"))
        if tick is not None and newest < tick < now:
            late[name] = now - tick
    return SchedulerHealth(schedules=len(states), late=late)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


WORKER_PREFIX = keys.WORKER


async def live_workers(broker: Broker) -> list[dict[str, Any]]:
    """The workers announced under ``worker:ID`` (expired ones are gone)."""
    out: list[dict[str, Any]] = []
    for key, raw in (await broker.kv_scan(WORKER_PREFIX)).items():
        try:
            info = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(info, dict):
            info.setdefault("id", key[len(WORKER_PREFIX) :])
            out.append(info)
    out.sort(key=lambda w: str(w.get("id")))
    return out


def split_prefetched(
    stats: Sequence[QueueStats], workers: Sequence[Mapping[str, Any]]
) -> list[QueueStats]:
    """``stats`` with each queue's leased jobs split into ``running`` (a
    handler runs them) and ``prefetched`` (a worker holds them in its buffer).

    A broker only knows leases, and a worker leases up to twice its
    concurrency beyond its slots for short jobs, so its ``running`` counted
    those too (62-66 "running" for one worker at -c 32).  The workers know
    which jobs wait: each announces its buffered jobs per queue with its
    heartbeat (``worker:ID``), so the split costs no write per job.  The
    announcement is as old as the worker's last heartbeat (5 s by default):
    ``prefetched`` is capped at the leased count, and ``running`` is the rest
    (jobs of a worker that stopped heartbeating stay ``running`` until their
    lease runs out).
    """
    held: dict[str, int] = {}
    for w in workers:
        per_queue = w.get("prefetched")
        if not isinstance(per_queue, Mapping):
            continue  # not a worker's announcement: nothing to split
        for queue, n in per_queue.items():
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                held[str(queue)] = held.get(str(queue), 0) + n
    out: list[QueueStats] = []
    for s in stats:
        waiting = min(held.get(s.queue, 0), s.running)
        out.append(replace(s, running=s.running - waiting, prefetched=waiting) if waiting else s)
    return out


async def queue_stats(broker: Broker) -> tuple[list[QueueStats], list[dict[str, Any]]]:
    """The broker's queue stats with running and prefetched told apart
    (``split_prefetched``), and the live workers they were split with."""
    stats = await broker.stats()
    workers = await live_workers(broker)
    return split_prefetched(stats, workers), workers


class StatsCache:
    """The last ``Snapshot`` of a broker, refreshed at most every ``interval`` s.

    Scrapes, dashboard pages and alert passes in one process share it, so a
    hundred browser tabs polling the overview cost one ``stats()`` call per
    interval.  Concurrent callers of ``get`` wait for the same refresh.  Each
    refresh also records a throughput sample (see dashboard/throughput.py),
    so the dashboard's chart fills wherever snapshots are taken.
    """

    def __init__(self, broker: Broker, interval: float = DEFAULT_INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self.snapshot: Snapshot | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self, max_age: float | None = None) -> Snapshot:
        """The snapshot, refreshed first if older than ``max_age`` (default: interval)."""
        limit = self.interval if max_age is None else max_age
        snap = self.snapshot
        if snap is not None and time.time() - snap.at < limit:
            return snap
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:
            snap = self.snapshot
            if snap is not None and time.time() - snap.at < limit:
                return snap  # refreshed by another caller while we waited
            return await self.refresh()

    async def refresh(self, now: float | None = None) -> Snapshot:
        """Read the broker now.  ``now`` (tests, alert passes at a given time)
        is the time the scheduler's lateness is measured at."""
        now = time.time() if now is None else now
        stats, workers = await queue_stats(self.broker)
        try:
            scheduler = await scheduler_health(self.broker, now)
        except Exception:
            log.exception("could not read the schedules' state")
            scheduler = None
        snap = Snapshot(at=now, stats=tuple(stats), workers=tuple(workers), scheduler=scheduler)
        self.snapshot = snap
        try:
            await record_sample(self.broker, snap)
        except Exception:
            log.exception("could not record a throughput sample")
        return snap

    async def run(self) -> None:
        """Refresh every ``interval`` s until cancelled (a worker side service)."""
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("could not read the broker's stats; will try again")
            await asyncio.sleep(self.interval)

    async def __call__(self, worker: Worker) -> None:
        await self.run()


# -- gauges ------------------------------------------------------------------------

_QUEUE_GAUGES: tuple[tuple[str, str], ...] = (
    ("dumbwaiter_queue_ready", "ready"),
    ("dumbwaiter_queue_scheduled", "scheduled"),
    ("dumbwaiter_queue_retrying", "retrying"),
    ("dumbwaiter_queue_running", "running"),
    ("dumbwaiter_queue_prefetched", "prefetched"),
    ("dumbwaiter_queue_dead", "dead"),
    ("dumbwaiter_queue_lag_seconds", "lag"),
    ("dumbwaiter_queue_paused", "paused"),
)


_SCALE_GAUGES: tuple[tuple[str, str], ...] = (
    ("dumbwaiter_queue_desired_workers", "desired_workers"),
    ("dumbwaiter_queue_backlog_per_worker", "backlog_per_worker"),
)


class QueueCollector:
    """A prometheus-client collector of the gauges in ``CATALOGUE``, read from
    a ``StatsCache``'s last snapshot (never from the broker: a scrape runs in
    the HTTP server's thread, and must stay cheap)."""

    def __init__(self, cache: StatsCache) -> None:
        self.cache = cache

    def describe(self) -> list[Metric]:
        return []  # the names are known, but the families are built per scrape

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.cache.snapshot
        if snap is None:
            return
        for name, attr in _QUEUE_GAUGES:
            fam = GaugeMetricFamily(name, BY_NAME[name].help, labels=["queue"])
            for s in snap.stats:
                fam.add_metric([s.queue], float(getattr(s, attr)))
            yield fam
        fam = GaugeMetricFamily(
            "dumbwaiter_queue_workers", BY_NAME["dumbwaiter_queue_workers"].help, labels=["queue"]
        )
        for s in snap.stats:
            fam.add_metric([s.queue], float(snap.workers_on(s.queue)))
        yield fam
        figures = scales(snap.stats, snap.workers)
        for name, attr in _SCALE_GAUGES:
            fam = GaugeMetricFamily(name, BY_NAME[name].help, labels=["queue"])
            for f in figures:
                fam.add_metric([f.queue], float(getattr(f, attr)))
            yield fam
        yield GaugeMetricFamily(
            "dumbwaiter_workers", BY_NAME["dumbwaiter_workers"].help, value=len(snap.workers)
        )
        if snap.scheduler is not None:
            yield GaugeMetricFamily(
                "dumbwaiter_scheduler_leader",
                BY_NAME["dumbwaiter_scheduler_leader"].help,
                value=1.0 if snap.scheduler.leader(SCHEDULER_SLACK) else 0.0,
            )
        yield GaugeMetricFamily(
            "dumbwaiter_stats_age_seconds",
            BY_NAME["dumbwaiter_stats_age_seconds"].help,
            value=max(0.0, time.time() - snap.at),
        )


# -- what happens: the middleware ------------------------------------------------------

_T0 = "dumbwaiter.metrics.t0"


class PrometheusMiddleware(Middleware):
    """Counts and times jobs in this process (see ``CATALOGUE``).

    ``App(middleware=[PrometheusMiddleware()])``, or ``dumbwaiter worker
    --metrics-port N``, which installs it.  Metrics are registered once per
    registry: two middleware on the same registry share them.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        prom = _prometheus()
        self.registry: CollectorRegistry = registry if registry is not None else prom.REGISTRY
        self.m = _families(self.registry)
        self._children: dict[tuple[str, str, str], Any] = {}

    def _child(self, metric: str, queue: str, task: str) -> Any:
        """The labelled child, cached: ``labels()`` costs a lock and a dict per call."""
        key = (metric, queue, task)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.m[metric].labels(queue, task)
        return child

    def after_enqueue(self, message: Message, id: str) -> None:
        if id != message.id:
            return  # a duplicate key: nothing new was stored
        if message.kind == "event" and not message.queue:
            self.m["dumbwaiter_events_published"].labels(message.name).inc()
        else:
            self._child("dumbwaiter_jobs_enqueued", message.queue, message.name).inc()

    def before_process(self, ctx: Context) -> None:
        m = ctx.message
        ctx.state[_T0] = time.perf_counter()
        self._child("dumbwaiter_jobs_started", m.queue, m.name).inc()
        if m.attempt <= 1 and not m.errors:
            # only a new job's first start: a retry waited for its backoff, a
            # replayed dead letter since it was created, neither for a worker
            since = max(m.created_at, m.eta or 0.0)
            if since > 0:
                wait = max(0.0, time.time() - since)
                self._child("dumbwaiter_job_wait_seconds", m.queue, m.name).observe(wait)

    def after_process(self, ctx: Context, result: Any, exc: BaseException | None) -> None:
        m = ctx.message
        t0 = ctx.state.get(_T0)
        if t0 is not None:
            self._child("dumbwaiter_job_run_seconds", m.queue, m.name).observe(
                time.perf_counter() - t0
            )
        if exc is None:
            self._child("dumbwaiter_jobs_succeeded", m.queue, m.name).inc()

    def on_retry(self, ctx: Context, error: ErrorRecord, at: float) -> None:
        self._child("dumbwaiter_jobs_retried", ctx.queue, ctx.name).inc()

    def on_dead(self, ctx: Context | None, error: ErrorRecord) -> None:
        queue, task = (ctx.queue, ctx.name) if ctx is not None else ("unknown", "unknown")
        self._child("dumbwaiter_jobs_dead", queue, task).inc()

    def on_rescued(self, worker: Worker, count: int) -> None:
        self.m["dumbwaiter_jobs_rescued"].inc(count)

    def on_workflow_run(self, workflow: str, run_id: str, status: str) -> None:
        self._child("dumbwaiter_workflow_runs", workflow, status).inc()

    def on_workflow_step(self, workflow: str, step: str, seconds: float, ok: bool) -> None:
        self._child("dumbwaiter_workflow_step_seconds", workflow, step).observe(seconds)
        if not ok:
            self._child("dumbwaiter_workflow_step_failures", workflow, step).inc()


_registered: dict[int, tuple[Any, dict[str, Any]]] = {}


def _families(registry: CollectorRegistry) -> dict[str, Any]:
    """The middleware's metric objects on ``registry``, made the first time."""
    held = _registered.get(id(registry))
    if held is not None and held[0] is registry:
        return held[1]
    prom = _prometheus()
    out: dict[str, Any] = {}
    for spec in CATALOGUE:
        if spec.source != "middleware":
            continue
        if spec.kind == COUNTER:
            out[spec.base] = prom.Counter(spec.base, spec.help, spec.labels, registry=registry)
        elif spec.kind == HISTOGRAM:
            buckets = WAIT_BUCKETS if "wait" in spec.name else RUN_BUCKETS
            out[spec.name] = prom.Histogram(
                spec.name, spec.help, spec.labels, registry=registry, buckets=buckets
            )
    _registered[id(registry)] = (registry, out)
    return out


# -- wiring -----------------------------------------------------------------------------


def install(app: App, middleware: Middleware) -> None:
    """Add ``middleware`` to ``app``'s chain (last, so innermost) unless one of
    its class is there already: the CLI adds what its options ask for to an
    app loaded from the user's module."""
    if any(type(m) is type(middleware) for m in app.middleware.middleware):
        return
    app.use(middleware)


def register_collector(registry: CollectorRegistry, cache: StatsCache) -> QueueCollector:
    """Register the queue gauges of ``cache`` on ``registry``."""
    _prometheus()
    collector = QueueCollector(cache)
    registry.register(collector)
    return collector


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registry`` and its content type (for /metrics)."""
    prom = _prometheus()
    body: bytes = prom.generate_latest(registry)
    return body, str(prom.CONTENT_TYPE_LATEST)


@dataclass(slots=True)
class MetricsServer:
    """The worker's /metrics endpoint: the middleware, the gauges and an HTTP
    server on ``host:port`` (loopback by default), as one side service."""

    app: App
    port: int
    host: str = "127.0.0.1"
    interval: float = DEFAULT_INTERVAL
    registry: CollectorRegistry | None = None
    cache: StatsCache = field(init=False)
    _server: Any = None

    def __post_init__(self) -> None:
        prom = _prometheus()
        if self.registry is None:
            self.registry = prom.REGISTRY
        self.cache = StatsCache(self.app.broker, self.interval)
        install(self.app, PrometheusMiddleware(self.registry))
        register_collector(self.registry, self.cache)

    def start(self) -> int:
        """Serve /metrics in a daemon thread; return the port (useful with 0)."""
        prom = _prometheus()
        server, _thread = prom.start_http_server(self.port, addr=self.host, registry=self.registry)
        self._server = server
        port: int = server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", self.host, port)
        return port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    async def __call__(self, worker: Worker) -> None:
        """As a worker side service: serve, and keep the gauges fresh."""
        if self._server is None:
            self.start()
        try:
            await self.cache.run()
        finally:
            self.stop()


def port_for_process(port: int) -> int:
    """``--metrics-port`` with ``--processes N``: child i serves port + i."""
    return port + int(os.environ.get("DUMBWAITER_PROCESS_INDEX", "0") or 0)


def names(kind: str | None = None) -> Sequence[str]:
    """Every exposed metric name (of one ``kind``), for docs and tests."""
    return [m.name for m in CATALOGUE if kind is None or m.kind == kind]
