"""The ``dumbwaiter`` command line: one program, one module per noun.

Every command finds the app with ``--app module:attr`` (or
``$DUMBWAITER_APP``); admin commands can also work from a bare broker URL
(``--url`` or ``$DUMBWAITER_URL``), since they need no task code.
"""

from __future__ import annotations

import click

from .common import CONTEXT_SETTINGS
from .worker import worker


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="dumbwaiter")
def main() -> None:
    """Background jobs and events: workers, queues, dead letters."""


main.add_command(worker)

for _module, _name in (
    ("admin", "stats"),
    ("jobs", "jobs"),
    ("dlq", "dlq"),
    ("admin", "enqueue"),
    ("demo", "demo"),
):
    try:
        _mod = __import__(f"{__name__}.{_module}", fromlist=[_name])
    except ModuleNotFoundError as _exc:  # a command module not written yet
        if _exc.name != f"{__name__}.{_module}":
            raise
        continue
    main.add_command(getattr(_mod, _name))
