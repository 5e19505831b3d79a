"""``dumbwaiter batches ls | show``: batch jobs and their progress."""

from __future__ import annotations

from typing import Any

import click
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..batch import Batch, list_batches
from .admin import call
from .common import app_options, resolve_app
from .output import console, print_json, relative, table

_STYLE = {"complete": "green", "failed": "red", "running": "yellow", "enqueuing": "cyan"}


@click.group()
def batches() -> None:
    """Batch jobs (app.batch): shards done, failed and pending."""


def _bar(p: dict[str, Any]) -> ProgressBar:
    total = p.get("total") or max(p["done"] + p["failed"], 1)
    return ProgressBar(total=total, completed=p["done"], width=30)


@batches.command("ls")
@app_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def ls(app_spec: str | None, url: str | None, as_json: bool) -> None:
    """Every batch kept in the broker (7 days), newest first."""
    app = resolve_app(app_spec, url)
    rows = call(app, lambda _: list_batches(app))
    if as_json:
        print_json({"batches": rows})
        return
    if not rows:
        click.echo("no batches")
        return
    t = table("batch", "name", "progress", "done", "failed", "total", "state", "started")
    for p in rows:
        t.add_row(
            p["id"],
            str(p.get("name", "")),
            _bar(p),
            str(p["done"]),
            str(p["failed"]),
            "?" if p.get("total") is None else str(p["total"]),
            Text(p["state"], style=_STYLE.get(p["state"], "")),
            relative(p.get("created_at")),
        )
    console().print(t)


@batches.command("show")
@app_options
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def show(app_spec: str | None, url: str | None, batch_id: str, as_json: bool) -> None:
    """One batch: its task, shards and items, progress and callbacks."""
    app = resolve_app(app_spec, url)
    p = call(app, lambda _: Batch(app, batch_id).aprogress())
    if "task" not in p:
        raise click.ClickException(f"no batch {batch_id} is kept (unknown, or older than 7 days)")
    if as_json:
        print_json(p)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("batch", p["id"])
    grid.add_row("name", str(p.get("name")))
    grid.add_row("task", str(p["task"]))
    grid.add_row("state", Text(p["state"], style=_STYLE.get(p["state"], "")))
    grid.add_row("progress", _bar(p))
    grid.add_row(
        "shards",
        f"{p['done']} done, {p['failed']} failed, "
        f"{'?' if p['pending'] is None else p['pending']} pending of "
        f"{'?' if p['total'] is None else p['total']} ({p['chunk_size']} items each)",
    )
    grid.add_row("items", "?" if p.get("items") is None else f"{p['items']:,}")
    grid.add_row("started", relative(p.get("created_at")))
    for which in ("on_complete", "on_failure"):
        if p.get(which):
            grid.add_row(which, str(p[which]["t"]))
    console().print(grid)
