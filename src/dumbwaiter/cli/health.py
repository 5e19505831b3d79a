"""``dumbwaiter health``: is a worker on this host alive?  For liveness probes.

A worker heartbeats from its event loop (every 5 s by default) into the
broker (``worker:HOST:PID:TAG``, which ``stats`` and the dashboard read).
A fresh heartbeat shows the two things a probe must know: the worker's loop
still runs (a loop stuck in a blocking call stops heartbeating, where an
HTTP thread would still answer), and it reaches the broker.  So this
command asks the broker for the workers of this host (its hostname: in
Kubernetes, the pod's name) and exits 0 when one heartbeated within
``--max-age`` seconds, 1 otherwise, naming what it saw.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import click

from ..brokers.base import Broker
from ..metrics import live_workers
from .admin import call
from .common import app_options, resolve_app
from .output import print_json

#: seconds since the last heartbeat after which a worker counts as stuck:
#: three heartbeats missed at the default interval
DEFAULT_MAX_AGE = 20.0


@click.command()
@app_options
@click.option(
    "--host",
    default=None,
    help="Whose workers to check: a hostname (default: this machine's, the pod's name).",
)
@click.option(
    "--max-age",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_MAX_AGE,
    show_default=True,
    help="Seconds since a worker's last heartbeat after which it counts as stuck.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def health(
    app_spec: str | None, url: str | None, host: str | None, max_age: float, as_json: bool
) -> None:
    """Exit 0 if a worker on this host heartbeated within --max-age seconds.

    For a liveness probe (Kubernetes exec probe, systemd watchdog, a
    monitor): the heartbeat comes from the worker's event loop through the
    broker, so a stuck loop or a lost broker fails it.  Exit 1 names the
    workers seen, if any.
    """
    app = resolve_app(app_spec, url)
    name = host or socket.gethostname()

    async def read(b: Broker) -> list[dict[str, Any]]:
        return await live_workers(b)

    now = time.time()
    mine = [w for w in call(app, read) if str(w.get("id", "")).split(":", 1)[0] == name]
    ages = {str(w.get("id")): now - float(w.get("heartbeat_at") or 0.0) for w in mine}
    alive = sorted(i for i, age in ages.items() if age <= max_age)
    if as_json:
        print_json({"host": name, "healthy": bool(alive), "workers": ages})
    elif alive:
        click.echo(f"ok: {', '.join(f'{i} ({ages[i]:.1f} s ago)' for i in alive)}")
    elif ages:
        stale = ", ".join(f"{i} ({age:.0f} s ago)" for i, age in sorted(ages.items()))
        click.echo(f"unhealthy: no heartbeat on {name} within {max_age:g} s: {stale}", err=True)
    else:
        click.echo(f"unhealthy: no live worker on {name}", err=True)
    if not alive:
        raise SystemExit(1)
