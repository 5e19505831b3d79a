"""``dumbwaiter state reset-identity``: move an app to another state store on purpose.

A broker that keeps its job state apart from its transport (RabbitMQ's
``state=``) announces which store the app uses, and refuses a process that
brings another (``StateStoreConflict``).  Changing the store on purpose is
then three steps: stop every process of the app, forget the announcement
here, start the processes with the new store (the first one announces it).
"""

from __future__ import annotations

import click

from ..redact import mask_url
from .admin import call
from .common import app_options, resolve_app
from .output import console, print_json


@click.group()
def state() -> None:
    """The app's state store, where the broker keeps it apart (RabbitMQ's state=)."""


@state.command("reset-identity")
@app_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def reset_identity(app_spec: str | None, url: str | None, yes: bool, as_json: bool) -> None:
    """Forget which state store the broker namespace announced, so the next
    process to start announces its own.

    Refused while any process that uses the announced store still runs
    (workers, schedulers, dashboards, producers): stop them all first.  The
    records of the old store (history, results, unique keys, the dead-letter
    index) stay there; jobs waiting in the broker run from their copies
    (RabbitMQ: docs/rabbitmq.md, "Changing the state store").
    """
    app = resolve_app(app_spec, url)
    where = mask_url(app.url)
    if not yes and not as_json:
        click.confirm(
            f"Forget the state store announced for {where}? Every process of the app must "
            "be stopped",
            abort=True,
        )
    forgot = call(app, lambda b: b.forget_state_identity(), open_first=False)
    if as_json:
        print_json({"broker": where, "forgotten": forgot})
        return
    if forgot:
        console().print(
            f"forgot the state store announced for {where}: the next process to start "
            "announces its own"
        )
    else:
        console().print(f"{where}: no state store was announced (nothing to forget)")
