"""The ``dumbwaiter`` command line: one program, one module per noun.

Every command finds the app with ``--app module:attr`` (or
``$DUMBWAITER_APP``); admin commands can also work from a bare broker URL
(``--url`` or ``$DUMBWAITER_URL``), since they need no task code.

Command modules are imported only when their command runs, so ``dumbwaiter
worker`` does not pay (in start-up time and memory) for the tables and
progress bars of the admin commands.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from ..errors import BrokerError
from .common import CONTEXT_SETTINGS

#: command name -> "module:attribute" inside this package
COMMANDS = {
    "worker": "worker:worker",
    "stats": "admin:stats",
    "enqueue": "admin:enqueue",
    "jobs": "jobs:jobs",
    "queues": "queues:queues",
    "dlq": "dlq:dlq",
    "demo": "demo:demo",
    "migrate": "migrate:migrate",
    "scheduler": "scheduler:scheduler",
    "schedules": "schedules:schedules",
    "events": "events:events",
    "batches": "batches:batches",
    "workflows": "workflows:workflows",
    "relay": "relay:relay",
    "publish": "events:publish",
    "dashboard": "dashboard:dashboard",
    "alerts": "alerts:alerts",
    "doctor": "doctor:doctor",
    "health": "health:health",
    "state": "state:state",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(f"{__name__}.{module_name}")
        command: click.Command = getattr(module, attr)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a broker that cannot serve it (unreachable,
        refusing the credentials, no such database) is one line naming the
        server and the cause, and exit status 1, never a traceback."""
        try:
            return super().invoke(ctx)
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="dumbwaiter")
def main() -> None:
    """Background jobs and events: workers, queues, dead letters."""
