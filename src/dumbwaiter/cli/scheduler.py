"""``dumbwaiter scheduler``: one scheduler replica, until SIGTERM/SIGINT.

Run as many as you like (one per pod, host or availability zone): one of
them leads and enqueues the ticks, the others wait to take over.  A clean
stop gives the lease up, so a follower leads within one poll; a killed
leader is replaced within about one lease.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import click

from ..scheduler import DEFAULT_LEASE, Scheduler
from .common import app_option, log_level_option, loop_option, require_app, setup_logging
from .common import serve as run_on_loop

log = logging.getLogger("dumbwaiter.cli")


@click.command()
@app_option
@click.option(
    "--lease",
    type=click.FloatRange(min=0.5),
    default=DEFAULT_LEASE,
    show_default=True,
    help="Seconds the leader lease lasts without a renewal (a dead leader's "
    "replacement starts within about this long).",
)
@loop_option
@log_level_option
def scheduler(app_spec: str | None, lease: float, log_level: str, loop: str) -> None:
    """Enqueue the app's periodic tasks on time, once per tick, in any number of replicas."""
    setup_logging(log_level)
    app = require_app(app_spec)
    if not app.schedules:
        log.warning("the app has no @app.periodic schedules; this scheduler will only wait")
    run_on_loop(serve(Scheduler(app, lease=lease)), loop)


async def serve(s: Scheduler) -> None:
    """Run ``s`` until the first SIGTERM/SIGINT, then give the lease up and return."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    runner = asyncio.create_task(s.run(), name="dumbwaiter-scheduler")

    def on_signal(signame: str) -> None:
        log.info("%s: stopping the scheduler", signame)
        runner.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        await runner
    except asyncio.CancelledError:
        if task is not None and task.cancelling():
            raise
    finally:
        await s.app.broker.close()
