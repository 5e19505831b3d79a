"""``dumbwaiter workflows ls|show|cancel|retry|signal``: durable workflow runs.

The runs of ``@app.workflow`` (docs/durable-workflows.md).  The fixed
pipelines of ``dw.chain/group/chord`` are jobs, shown by ``dumbwaiter jobs
show``.  Every command works from ``--url`` alone; ``signal`` with
``--app`` also validates the payload against the event class.
"""

from __future__ import annotations

import time
from typing import Any

import click
import orjson
from rich.table import Table
from rich.text import Text

from ..durable import admin
from ..durable.store import STATES
from .admin import call
from .common import app_options, resolve_app
from .output import console, duration, one_line, print_json, relative, table, when

_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "running": "cyan",
    "sleeping": "yellow",
    "waiting": "yellow",
    "pending": "",
}


@click.group()
def workflows() -> None:
    """Durable workflow runs (@app.workflow): list, inspect, cancel, retry, signal."""


def _waiting(rec: dict[str, Any]) -> str:
    w = rec.get("waiting") or {}
    kind = w.get("kind")
    if not kind or rec.get("status") in ("succeeded", "failed", "cancelled"):
        return ""
    name = w.get("name", "")
    if kind == "event":
        match = w.get("match") or {}
        cond = ", ".join(f"{k}={v!r}" for k, v in match.items())
        text = f"event {w.get('event')}" + (f" ({cond})" if cond else "") + f" at {name!r}"
    elif kind == "child":
        text = f"child run {w.get('run')} at {name!r}"
    elif kind == "retry":
        text = f"retry of {name!r} (attempt {w.get('attempt')})"
    elif kind == "compensate":
        text = f"retry of the compensation of {name!r}"
    elif kind == "version":
        text = str(name)
    else:
        text = f"{kind} {name!r}"
    wake = rec.get("wake_at")
    if isinstance(wake, int | float):
        text += f" until {when(wake)}"
    return text


@workflows.command("ls")
@app_options
@click.option("-s", "--status", type=click.Choice(STATES), help="Only runs in this status.")
@click.option("-w", "--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option(
    "-n", "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Rows."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def ls(
    app_spec: str | None,
    url: str | None,
    status: str | None,
    workflow: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Runs kept in the broker (finished ones for their retention), newest first."""
    app = resolve_app(app_spec, url)
    rows = call(app, lambda _: admin.list_runs(app, status=status, workflow=workflow, limit=limit))
    if as_json:
        print_json({"runs": [_summary(r) for r in rows]})
        return
    if not rows:
        click.echo("no workflow runs" + (f" in status {status}" if status else ""))
        return
    now = time.time()
    t = table("run", "workflow", "v", "status", "waiting for", "started", "updated", "error")
    for r in rows:
        err = r.get("error") or {}
        t.add_row(
            Text(str(r.get("id"))),
            Text(str(r.get("workflow"))),
            str(r.get("version", 1)),
            Text(str(r.get("status")), style=_STYLE.get(str(r.get("status")), "")),
            Text(_waiting(r)),
            relative(r.get("created_at"), now),
            relative(r.get("updated_at"), now),
            Text(
                one_line(f"{err.get('type')}: {err.get('message')}", 60) if err else "", style="red"
            ),
        )
    console().print(t)


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id", "workflow", "version", "status", "created_at", "updated_at", "finished_at",
        "waiting", "wake_at", "error", "parent",
    )  # fmt: skip
    return {k: r.get(k) for k in keys}


@workflows.command("show")
@app_options
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def show(app_spec: str | None, url: str | None, run_id: str, as_json: bool) -> None:
    """One run: inputs, status, what it waits for, and its timeline of steps
    (durations, attempts, outputs, errors)."""
    app = resolve_app(app_spec, url)
    d = call(app, lambda _: admin.describe(app, run_id))
    if as_json:
        print_json(d)
        return
    out = console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("run", str(d.get("id")))
    grid.add_row("workflow", f"{d.get('workflow')} (version {d.get('version', 1)})")
    status = str(d.get("status"))
    grid.add_row("status", Text(status, style=_STYLE.get(status, "")))
    args = orjson.dumps(d.get("args") or []).decode()
    kwargs = d.get("kwargs") or {}
    grid.add_row(
        "input", one_line(args + (f" {orjson.dumps(kwargs).decode()}" if kwargs else ""), 200)
    )
    if _waiting(d):
        grid.add_row("waiting for", _waiting(d))
    grid.add_row("started", when(d.get("created_at")))
    if d.get("finished_at"):
        grid.add_row("finished", when(d.get("finished_at")))
    if status == "succeeded":
        grid.add_row("result", one_line(orjson.dumps(d.get("result")).decode(), 200))
    if d.get("parent"):
        grid.add_row("parent", f"{d['parent'].get('run')} (step {d['parent'].get('name')!r})")
    err = d.get("error") or {}
    if err:
        where = f" at step {err['step']!r}" if err.get("step") else ""
        grid.add_row("error", Text(f"{err.get('type')}: {err.get('message')}{where}", style="red"))
        for c in err.get("compensation_errors") or []:
            grid.add_row(
                "", Text(f"{c.get('step')}: {c.get('type')}: {c.get('message')}", style="red")
            )
    out.print(grid)
    steps = d.get("steps") or []
    if not steps:
        return
    out.print()
    t = table("#", "step", "kind", "status", "took", "attempts", "output / error")
    for s in steps:
        took = s.get("duration")
        err = s.get("error") or {}
        if err:
            detail = Text(one_line(f"{err.get('type')}: {err.get('message')}", 80), style="red")
        elif s.get("kind") == "sleep":
            detail = Text(f"until {when(s.get('until'))}")
        elif s.get("kind") == "retrying":
            last = (s.get("errors") or [{}])[-1]
            why = f"{last.get('type')}: {last.get('message')}"
            detail = Text(
                one_line(f"next at {when(s.get('next_attempt_at'))}; {why}", 80),
                style="yellow",
            )
        else:
            detail = Text(one_line(orjson.dumps(s.get("output")).decode(), 80))
        style = {"failed": "red", "retrying": "yellow", "timed out": "yellow"}.get(
            str(s.get("status")), ""
        )
        pos = str(s.get("pos"))
        t.add_row(
            f"undo {int(pos[1:])}" if pos.startswith("c") else str(int(pos)),
            Text(str(s.get("name"))),
            str(s.get("kind")),
            Text(str(s.get("status")), style=style),
            "" if took is None else duration(float(took)),
            "" if s.get("attempts") is None else str(s.get("attempts")),
            detail,
        )
    out.print(t)


@workflows.command("cancel")
@app_options
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
def cancel(app_spec: str | None, url: str | None, run_ids: tuple[str, ...]) -> None:
    """Cancel runs that have not ended: no further step starts (one running
    finishes), nothing is compensated."""
    app = resolve_app(app_spec, url)

    async def go(_: Any) -> list[tuple[str, bool, str]]:
        out = []
        for rid in run_ids:
            done = await admin.cancel(app, rid)
            out.append((rid, done, await admin.status(app, rid)))
        return out

    for rid, done, status in call(app, go):
        click.echo(f"cancelled {rid}" if done else f"{rid} was not cancelled: it is {status}")


@workflows.command("retry")
@app_options
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
def retry(app_spec: str | None, url: str | None, run_ids: tuple[str, ...]) -> None:
    """Resume failed runs from the step that failed (the steps before it are
    not run again)."""
    app = resolve_app(app_spec, url)

    async def go(_: Any) -> None:
        for rid in run_ids:
            await admin.retry_run(app, rid)
            click.echo(f"resumed {rid}")

    call(app, go)


@workflows.command("signal")
@app_options
@click.argument("run_id", metavar="RUN")
@click.option("--payload", required=True, metavar="JSON", help="The event's payload (an object).")
@click.option("--step", metavar="NAME", help="Only if the run waits at this step.")
def signal(
    app_spec: str | None, url: str | None, run_id: str, payload: str, step: str | None
) -> None:
    """Resolve the event wait a run is parked at with PAYLOAD, as if a
    matching event had been published (with --app, it is validated first)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if not isinstance(body, dict):
        raise click.BadParameter("the payload is a JSON object", param_hint="--payload")
    app = resolve_app(app_spec, url)
    call(app, lambda _: admin.signal(app, run_id, body, step))
    click.echo(f"signalled {run_id}")
