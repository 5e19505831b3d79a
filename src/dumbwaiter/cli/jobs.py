"""``dumbwaiter jobs ls|show|cancel``: look at jobs in any state, cancel them
(a running one cooperatively: see ``dumbwaiter.cancel``)."""

from __future__ import annotations

import getpass
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.text import Text

from ..brokers.types import JobFilter, JobInfo, Page
from ..cancel import CANCELLED, REQUESTED, request_cancel
from ..state import State
from ..workflow import steps_of
from .admin import call, no_match, task_filter
from .common import app_options, resolve_app
from .output import (
    console,
    error_label,
    job_dict,
    note,
    plural,
    print_json,
    relative,
    render_job,
    table,
)

F = TypeVar("F", bound=Callable[..., Any])

#: most rows one page may ask for; more would only make one slow call
MAX_LIMIT = 1000


@click.group()
def jobs() -> None:
    """List, inspect and cancel jobs."""


def limit_option(fn: F) -> F:
    return click.option(
        "-n",
        "--limit",
        type=click.IntRange(1, MAX_LIMIT),
        default=50,
        show_default=True,
        help="Rows per page.",
    )(fn)


def cursor_option(fn: F) -> F:
    return click.option(
        "--cursor", metavar="CURSOR", help="Continue after the page that printed this cursor."
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(fn)


def print_page(page: Page, *, as_json: bool, dead_letters: bool, empty: str) -> None:
    """A page of jobs as a table (or ``{"items": [...], "cursor": ...}``), newest first,
    with the cursor of the next page when there is one."""
    if as_json:
        print_json({"items": [job_dict(i) for i in page.items], "cursor": page.cursor})
        return
    if not page.items:
        click.echo(empty)
        return
    now = time.time()
    if dead_letters:
        t = table("id", "task", "queue", "died", "attempts", "replays", "last error")
        for info in page.items:
            m = info.message
            last = m.errors[-1] if m.errors else None
            t.add_row(
                Text(m.id),
                Text(m.name),
                Text(m.queue),
                relative(info.updated_at, now),
                str(len(m.errors)),
                str(info.replays),
                Text(error_label(last) if last else "-", style="red"),
            )
    else:
        t = table("id", "task", "queue", "state", "attempt", "created", "updated", "last error")
        for info in page.items:
            m = info.message
            last = m.errors[-1] if m.errors else None
            t.add_row(
                Text(m.id),
                Text(m.name),
                Text(m.queue),
                Text(str(info.state), style=_STATE_STYLE.get(info.state, "")),
                f"{m.attempt}/{m.max_attempts}",
                relative(m.created_at or None, now),
                relative(info.updated_at, now),
                Text(error_label(last) if last else "", style="red"),
            )
    console().print(t)
    if page.cursor is not None:
        click.echo(f"more: add --cursor {page.cursor} for the next page")


_STATE_STYLE = {
    State.SUCCEEDED: "green",
    State.DEAD: "red",
    State.RETRYING: "yellow",
    State.RUNNING: "cyan",
    State.CANCELLED: "dim",
}


@jobs.command("ls")
@app_options
@click.option("-q", "--queue", help="Only jobs of this queue.")
@click.option(
    "-s",
    "--state",
    type=click.Choice([s.value for s in State]),
    help="Only jobs in this state.",
)
@click.option(
    "-t",
    "--task",
    "task_name",
    metavar="NAME",
    help="Only jobs of this task (with --app, a short name like send_welcome works).",
)
@click.option(
    "-k",
    "--key",
    metavar="KEY",
    help="Only jobs whose key is exactly KEY (a task's unique key or an event's ordering key).",
)
@limit_option
@cursor_option
@json_option
def ls(
    app_spec: str | None,
    url: str | None,
    queue: str | None,
    state: str | None,
    task_name: str | None,
    key: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List jobs, newest first.

    ``--key`` searches every stored job, not only recent ones.
    """
    app = resolve_app(app_spec, url)
    name = task_filter(app, task_name)
    f = JobFilter(queue=queue, name=name, state=State(state) if state else None, key=key)
    page = call(app, lambda b: b.list_jobs(f, cursor, limit))
    print_page(page, as_json=as_json, dead_letters=False, empty=no_match("no jobs", app, name))


def get_job(app_spec: str | None, url: str | None, job_id: str) -> JobInfo:
    """The stored job, or a clear error when there is none."""
    app = resolve_app(app_spec, url)
    info = call(app, lambda b: b.get(job_id))
    if info is None:
        raise click.ClickException(
            f"no job {job_id} is stored (never enqueued, or pruned after its retention)"
        )
    return info


@jobs.command("show")
@app_options
@click.argument("job_id", metavar="ID")
@json_option
def show(app_spec: str | None, url: str | None, job_id: str, as_json: bool) -> None:
    """Show one job: envelope, state, result, and every error.

    Each error comes with its time, exception type, message, worker and
    traceback.
    """
    info = get_job(app_spec, url, job_id)
    wf = info.message.headers.get("wf")
    wf_id = str(wf["id"]) if isinstance(wf, dict) and wf.get("id") else None
    steps: list[dict[str, Any]] = []
    if wf_id is not None:
        app = resolve_app(app_spec, url)
        steps = call(app, lambda b: steps_of(app, wf_id))
    if as_json:
        d = job_dict(info)
        if steps:
            d["workflow"] = {"id": wf_id, "steps": steps}
        print_json(d)
        return
    render_job(info)
    if steps:
        out = console()
        out.print()
        out.print(Text(f"Workflow {wf_id}", style="bold underline"))
        t = table("step", "task", "job", "state")
        for s in steps:
            mark = " <- this job" if s["job"] == info.message.id else ""
            t.add_row(s["path"], s["task"], s["job"], Text(s["state"] + mark))
        out.print(t)


@jobs.command("cancel")
@app_options
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True)
@json_option
def cancel(app_spec: str | None, url: str | None, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Cancel jobs; ask the workers of running ones to stop them.

    Scheduled, ready and retrying jobs are cancelled at once.  For a running
    job the request is stored in the broker: its worker sees it within a
    heartbeat (5 s by default), and the handler through ``ctx.cancelled`` /
    ``ctx.raise_if_cancelled()``; a handler that stops ends the job
    ``cancelled``, one that returns normally ends it ``succeeded``.  Says what
    became of each id; exits 1 when nothing was cancelled or requested.
    """
    ids = list(dict.fromkeys(job_ids))  # unique, in the order given
    app = resolve_app(app_spec, url)
    outcome = call(app, lambda b: request_cancel(b, ids, _who()))
    done = [i for i, o in outcome.items() if o == CANCELLED]
    asked = [i for i, o in outcome.items() if o == REQUESTED]
    refused = {i: o for i, o in outcome.items() if o not in (CANCELLED, REQUESTED)}
    if as_json:
        print_json({"cancelled": done, "requested": asked, "not_cancelled": refused})
    else:
        for i in done:
            click.echo(f"cancelled {i}")
        for i in asked:
            click.echo(f"asked to stop {i}: it is running; its handler sees ctx.cancelled")
        for i, why in refused.items():
            click.echo(f"not cancelled {i}: {why}", err=True)
        if refused and (done or asked):
            note(
                f"cancelled or asked to stop {len(done) + len(asked)} of {plural(len(ids), 'job')}"
            )
    if not done and not asked:
        sys.exit(1)


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container: the host is enough
        user = "?"
    return f"{user}@{socket.gethostname()}"
