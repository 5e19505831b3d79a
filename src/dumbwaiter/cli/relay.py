"""``dumbwaiter relay``: move the transactional outbox of a database to the broker."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from ..relay import Relay
from .common import app_options, log_level_option, loop_option, resolve_app, serve, setup_logging


@click.command()
@app_options
@click.option(
    "--source",
    metavar="URL",
    envvar="DUMBWAITER_OUTBOX_URL",
    required=True,
    help="The database holding dw_outbox: sqlite:///PATH or postgresql://... "
    "[env DUMBWAITER_OUTBOX_URL].",
)
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option(
    "--retention",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Seconds relayed rows are kept before they are pruned.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.5),
    default=10.0,
    show_default=True,
    help="Seconds the leading relay holds its lease; a standby takes over after it.",
)
@loop_option
@log_level_option
def relay(
    app_spec: str | None,
    url: str | None,
    source: str,
    batch: int,
    retention: float,
    lease: float,
    log_level: str,
    loop: str,
) -> None:
    """Relay committed outbox rows to the broker, in order, until SIGTERM.

    Run any number: one leads, the others take over when it stops."""
    setup_logging(log_level)
    app = resolve_app(app_spec, url)
    r = Relay(app, source, batch=batch, retention=retention, lease=lease)

    async def main() -> None:
        task = asyncio.create_task(r.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await app.broker.close()

    serve(main(), loop)
    click.echo(f"relayed {r.relayed} message(s)", err=True)
