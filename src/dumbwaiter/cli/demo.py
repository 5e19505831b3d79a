"""``dumbwaiter demo``: orders, workers, an outage, dead letters and their replay."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import click

DB_FILES = ("jobs.db", "jobs.db-wal", "jobs.db-shm", "shop.db", "shop.db-wal", "shop.db-shm")


@click.command()
@click.option(
    "--orders",
    type=click.IntRange(min=1, max=10_000),
    default=300,
    show_default=True,
    help="Orders to place.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=32),
    default=2,
    show_default=True,
    help="Worker processes sharing the SQLite file.",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for the demo's databases and worker logs (created if missing, "
    "kept afterwards) [default: a fresh temporary directory].",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the temporary directory (with the databases and worker logs) at the end.",
)
def demo(orders: int, workers: int, directory: Path | None, keep: bool) -> None:
    """Run the demo: an order API enqueues work; workers retry, dead-letter, replay.

    Everything runs on embedded SQLite in a fresh directory: receipts are
    mailed with dumbwaiter.mail into its mail/ folder, and the only network
    traffic is the signed webhooks (dumbwaiter.webhooks) to a partner's
    receiver the demo runs on 127.0.0.1.  Exits 0 only if every job was
    delivered.
    """
    temporary = directory is None
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="dumbwaiter-demo-"))
    else:
        directory.mkdir(parents=True, exist_ok=True)
        directory = directory.resolve()
        if any(c in str(directory) for c in "?#%"):
            raise click.BadParameter(f"{directory} has ? # or % in it", param_hint="--dir")
        for name in DB_FILES:  # a fresh database each run
            (directory / name).unlink(missing_ok=True)
    # dumbwaiter.demo builds its app from this variable, here and in the workers,
    # so it is set before the first import of the demo package.
    os.environ["DUMBWAITER_DEMO_DIR"] = str(directory)
    from rich.console import Console

    from ..errors import MissingDependency

    try:
        from ..demo.story import Options, run
    except MissingDependency as exc:  # the mail or webhooks extra is not installed
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
        raise click.ClickException(str(exc)) from None

    code = 1
    try:
        code = run(
            Options(orders=orders, workers=workers, directory=directory), Console(highlight=False)
        )
    finally:
        if temporary and not keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            click.echo(f"The databases and worker logs are in {directory}")
    sys.exit(code)
