"""``dumbwaiter worker``: run jobs until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading

import click

from ..app import App
from ..worker import Service, Worker, WorkerConfig
from .common import (
    app_option,
    log_format_option,
    log_level_option,
    loop_option,
    require_app,
    serve,
    setup_logging,
)

log = logging.getLogger("dumbwaiter.cli")


@click.command()
@app_option
@click.option(
    "-q",
    "--queues",
    default="",
    help="Comma-separated queues to work on, taken in turn so none starves "
    "[default: every queue of the app's tasks and subscriber groups].",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Jobs in flight at once in this process.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes to run (each with --concurrency slots).",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.5),
    default=15.0,
    show_default=True,
    help="Seconds a job stays ours without a heartbeat.",
)
@click.option(
    "--heartbeat",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Seconds between heartbeats [default: lease / 3].",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=25.0,
    show_default=True,
    help="Seconds running jobs get to finish after SIGTERM.",
)
@click.option(
    "--with-scheduler",
    is_flag=True,
    help="Also run a scheduler replica: the one leader among all replicas enqueues "
    "the app's periodic tasks.",
)
@click.option(
    "--with-relay",
    "relay_source",
    metavar="URL",
    envvar="DUMBWAITER_OUTBOX_URL",
    default=None,
    help="Also relay the transactional outbox of the database at URL (sqlite:///PATH or "
    "postgresql://...) to the broker; one replica leads [env DUMBWAITER_OUTBOX_URL].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve Prometheus metrics on http://HOST:PORT/metrics (with --processes N, "
    "process i serves PORT+i).  Needs dumbwaiter[metrics].",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="DUMBWAITER_METRICS_HOST",
    help="Address --metrics-port listens on; 0.0.0.0 lets a Prometheus outside the "
    "machine or pod scrape it [env DUMBWAITER_METRICS_HOST].",
)
@click.option(
    "--alerts/--no-alerts",
    "alerts",
    default=None,
    help="Evaluate the alert rules in this worker (default: when the app configures "
    "alerts); webhooks from the app's config or $DUMBWAITER_ALERT_WEBHOOKS.",
)
@loop_option
@log_level_option
@log_format_option
def worker(
    app_spec: str | None,
    queues: str,
    concurrency: int,
    processes: int,
    lease: float,
    heartbeat: float | None,
    grace: float,
    with_scheduler: bool,
    relay_source: str | None,
    metrics_port: int | None,
    metrics_host: str,
    alerts: bool | None,
    log_level: str,
    log_format: str,
    loop: str,
) -> None:
    """Run a worker: fetch jobs from QUEUES and run them, CONCURRENCY at a time.

    Each finished job is one log line: succeeded or retrying at INFO, dead at
    WARNING, with the task, the job id, the duration and the error
    (--log-format json: one JSON object per line, see docs/observability.md).
    """
    setup_logging(log_level, log_format)
    if processes > 1:
        sys.exit(_supervise(processes))
    app = require_app(app_spec)
    config = WorkerConfig(
        queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
        concurrency=concurrency,
        lease=lease,
        heartbeat=heartbeat if heartbeat is not None else lease / 3,
        grace=grace,
    )
    services: list[Service] = []
    if with_scheduler:
        from ..scheduler import Scheduler  # imported only when asked for

        services.append(Scheduler(app))
    if relay_source:
        from ..relay import service as relay_service

        services.append(relay_service(relay_source))
    services += _observability(app, metrics_port, metrics_host, alerts)
    w = Worker(app, config, services=services)
    serve(_serve(w, app), loop)
    # A timed-out sync job's thread may still run; it must not hold the exit.
    if any(t.name.startswith("dumbwaiter-job") and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        os._exit(0)


async def _serve(w: Worker, app: App) -> None:
    loop = asyncio.get_running_loop()
    signals = {"n": 0}

    def on_signal(signame: str) -> None:
        signals["n"] += 1
        if signals["n"] == 1:
            log.info("%s: finishing running jobs (again to stop at once)", signame)
            w.stop()
        else:
            log.warning("%s again: giving running jobs back now", signame)
            w.stop(immediate=True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        await w.run()
    finally:
        # the webhook deliveries' pooled HTTP client, if this worker sent
        # any: closed on the loop that opened it, not left to the exit (a
        # keep-alive receiver's socket then closes under a finished loop)
        if "webhooks" in app.__dict__:
            await app.webhooks.aclose()


def _observability(
    app: App, metrics_port: int | None, metrics_host: str, alerts: bool | None
) -> list[Service]:
    """The side services --metrics-port and --alerts ask for (imported only then)."""
    services: list[Service] = []
    if metrics_port is not None:
        from ..errors import MissingDependency
        from ..metrics import MetricsServer, port_for_process

        try:
            server = MetricsServer(app, port_for_process(metrics_port), metrics_host)
        except MissingDependency as exc:
            raise click.UsageError(str(exc)) from exc
        server.start()  # now, so a port in use fails at start-up, not later
        services.append(server)
    from ..alerts import AlertService, config_of, effective_config

    configured = config_of(app)
    if alerts or (alerts is None and configured is not None and configured.in_workers):
        services.append(AlertService(app, effective_config(app)))
    return services


def _supervise(n: int) -> int:
    """Run ``n`` single-process workers with the same arguments; forward signals."""
    args = list(sys.argv[1:])
    cmd = [sys.executable, "-m", "dumbwaiter", *_without_processes(args), "--processes", "1"]
    children = [
        subprocess.Popen(cmd, env={**os.environ, "DUMBWAITER_PROCESS_INDEX": str(i)})
        for i in range(n)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return max(codes, key=abs)


def _without_processes(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--processes":
            skip = True
            continue
        if a.startswith("--processes="):
            continue
        out.append(a)
    return out
