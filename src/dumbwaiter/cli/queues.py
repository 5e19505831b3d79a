"""``dumbwaiter queues pause|resume QUEUE``: stop and restart handing out a
queue's jobs.

Pausing is stored in the broker, so it holds for every worker (in any
process, on any host) and across restarts; enqueueing into a paused queue
still works, and jobs already running finish.  ``dumbwaiter stats`` shows
which queues are paused.
"""

from __future__ import annotations

import click

from ..brokers.base import Broker
from .admin import call
from .common import app_options, resolve_app
from .output import note, print_json


@click.group()
def queues() -> None:
    """Pause and resume queues."""


async def _set(broker: Broker, queue: str, paused: bool) -> tuple[bool, bool]:
    """Pause or resume ``queue``; return (it was paused before, it is known)."""
    rows = [s for s in await broker.stats() if s.queue == queue]
    await (broker.pause(queue) if paused else broker.resume(queue))
    return any(s.paused for s in rows), bool(rows)


def _unknown(queue: str, app_queues: list[str]) -> None:
    if queue not in app_queues:
        note(f"note: no job was ever stored in a queue named {queue!r} (a typo?)")


@queues.command("pause")
@app_options
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def pause(app_spec: str | None, url: str | None, queue: str, as_json: bool) -> None:
    """Stop handing out QUEUE's jobs to workers until it is resumed.

    Enqueueing still works and running jobs finish; a group's queue is
    group:NAME.
    """
    app = resolve_app(app_spec, url)
    was, known = call(app, lambda b: _set(b, queue, True))
    if not known:
        _unknown(queue, app.queues())
    if as_json:
        print_json({"queue": queue, "paused": True, "was_paused": was})
        return
    click.echo(f"paused {queue}" if not was else f"{queue} was already paused")
    if not was:
        note("running jobs finish; resume with: dumbwaiter queues resume " + queue)


@queues.command("resume")
@app_options
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def resume(app_spec: str | None, url: str | None, queue: str, as_json: bool) -> None:
    """Hand out QUEUE's jobs again."""
    app = resolve_app(app_spec, url)
    was, known = call(app, lambda b: _set(b, queue, False))
    if not known:
        _unknown(queue, app.queues())
    if as_json:
        print_json({"queue": queue, "paused": False, "was_paused": was})
        return
    click.echo(f"resumed {queue}" if was else f"{queue} was not paused")
