"""``dumbwaiter schedules ls|pause|resume|trigger``: look at and steer schedules.

With ``--app`` the schedules come from the code (and their state from the
broker); with only ``--url`` they come from what the leader stored in the
broker, so the commands work where the code is not installed.  Pausing is
written to the broker, so it holds for every replica and across restarts.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from rich.text import Text

from ..app import App
from ..brokers.base import Broker
from ..scheduler import ScheduleInfo, find, list_schedules, pause, resume, trigger
from .admin import call
from .common import app_options, resolve_app
from .output import console, note, print_json, relative, table, timestamp

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(fn)


@click.group()
def schedules() -> None:
    """List, pause, resume and trigger periodic schedules."""


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container: the host is enough
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _on(app: App, wanted: str, act: Callable[[Broker, str], Awaitable[T]]) -> tuple[str, T]:
    """Find the schedule ``wanted`` (its full name, or a unique last part) and
    run ``act(broker, full_name)``, in one broker session."""

    async def go(broker: Broker) -> tuple[str, T]:
        full = find([i.name for i in await list_schedules(app)], wanted)
        return full, await act(broker, full)

    return call(app, go)


@schedules.command("ls")
@app_options
@json_option
def ls(app_spec: str | None, url: str | None, as_json: bool) -> None:
    """Every schedule: expression, time zone, last run, next run, paused.

    Times are local with their UTC offset; --json gives epoch seconds.
    """
    app = resolve_app(app_spec, url)
    now = time.time()
    rows: list[ScheduleInfo] = call(app, lambda _b: list_schedules(app, now))
    if as_json:
        print_json({"schedules": [r.to_dict() for r in rows]})
        return
    if not rows:
        click.echo("no schedules (none in this app, and no scheduler has run on this broker)")
        return
    t = table("name", "task", "expression", "tz", "last run", "next run", "paused")
    has_code = bool(app.schedules)  # with a bare --url nothing is "in the app": no note
    for r in rows:
        t.add_row(
            Text(r.name + (" (not in this app)" if has_code and not r.in_code else "")),
            Text(r.task),
            Text(r.expression),
            Text(r.tz),
            Text(f"{timestamp(r.last_run)} ({relative(r.last_run, now)})" if r.last_run else "-"),
            Text(f"{timestamp(r.next_run)} ({relative(r.next_run, now)})" if r.next_run else "-"),
            Text("paused", style="yellow") if r.paused else Text(""),
        )
    console().print(t)


@schedules.command("pause")
@app_options
@click.argument("name")
@json_option
def pause_cmd(app_spec: str | None, url: str | None, name: str, as_json: bool) -> None:
    """Stop running NAME's ticks until it is resumed (on every replica, across restarts).

    Ticks that fall while it is paused are not run, and not caught up later.
    """
    app = resolve_app(app_spec, url)
    full, _ = _on(app, name, lambda b, n: pause(b, n, _who()))
    if as_json:
        print_json({"name": full, "paused": True})
    else:
        click.echo(f"paused {full}")
        note("a tick being enqueued at this very moment may still run")


@schedules.command("resume")
@app_options
@click.argument("name")
@json_option
def resume_cmd(app_spec: str | None, url: str | None, name: str, as_json: bool) -> None:
    """Run NAME's ticks again, from its next tick on."""
    app = resolve_app(app_spec, url)
    full, was = _on(app, name, resume)
    if as_json:
        print_json({"name": full, "paused": False, "was_paused": was})
    else:
        click.echo(f"resumed {full}" if was else f"{full} was not paused")


@schedules.command("trigger")
@app_options
@click.argument("name")
@json_option
def trigger_cmd(app_spec: str | None, url: str | None, name: str, as_json: bool) -> None:
    """Run NAME once now, outside its schedule (its next tick still runs), and print the job id."""
    app = resolve_app(app_spec, url)
    full, job_id = _on(app, name, lambda _b, n: trigger(app, n, _who()))
    if as_json:
        print_json({"name": full, "id": job_id})
    else:
        click.echo(job_id)
