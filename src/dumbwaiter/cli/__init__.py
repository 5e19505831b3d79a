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

import click

from .common import CONTEXT_SETTINGS

#: command name -> "module:attribute" inside this package
COMMANDS = {
    "worker": "worker:worker",
    "stats": "admin:stats",
    "enqueue": "admin:enqueue",
    "jobs": "jobs:jobs",
    "dlq": "dlq:dlq",
    "demo": "demo:demo",
    "migrate": "migrate:migrate",
    "scheduler": "scheduler:scheduler",
    "schedules": "schedules:schedules",
    "events": "events:events",
    "batches": "batches:batches",
    "relay": "relay:relay",
    "publish": "events:publish",
    "dashboard": "dashboard:dashboard",
    "alerts": "alerts:alerts",
    "doctor": "doctor:doctor",
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


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="dumbwaiter")
def main() -> None:
    """Background jobs and events: workers, queues, dead letters."""
