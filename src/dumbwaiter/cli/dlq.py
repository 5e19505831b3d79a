"""``dumbwaiter dlq ls|show|replay|purge|export``: the dead-letter queue.

Every command here addresses dead jobs only (the filter always carries
``state=dead``), and selects them the same way: ids as arguments, and
``--queue``, ``--task``, ``--error``, ``--since``, ``--until``.  The two that
change things, ``replay`` and ``purge``, refuse to run on an empty selection
unless ``--all`` says that every dead letter is meant: a forgotten filter
must not replay a whole outage's worth of jobs, or delete them.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO, Any, TypeVar

import click
import orjson
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from ..app import App
from ..brokers.base import Broker
from ..brokers.types import JobFilter
from ..state import State
from .admin import call, no_match, task_filter
from .common import app_options, resolve_app
from .jobs import cursor_option, get_job, json_option, limit_option, print_page
from .output import console, job_dict, note, plural, print_json, render_job, time_option, timestamp

F = TypeVar("F", bound=Callable[..., Any])

#: dead letters read per ``list_jobs`` call while exporting or counting
PAGE = 500


@click.group()
def dlq() -> None:
    """Dead letters: jobs that failed for good, and their errors."""


@dataclass(frozen=True, slots=True)
class Selection:
    """What the user asked for, and the JobFilter it makes."""

    filter: JobFilter
    narrowed: bool  # ids or a filter option was given
    all: bool

    def on(self, app: App) -> JobFilter:
        """The filter with ``--task`` as stored (a short name expanded by the app)."""
        name = task_filter(app, self.filter.name)
        return self.filter if name == self.filter.name else replace(self.filter, name=name)

    def require(self, verb: str) -> None:
        """Refuse to act on every dead letter by accident."""
        if not self.narrowed and not self.all:
            raise click.UsageError(
                f"refusing to {verb} every dead letter: give ids, a filter "
                "(--queue, --task, --error, --since, --until) or --all"
            )


def selection(fn: F) -> F:
    """``[ID]...`` and the filter options; the command receives ``sel: Selection``."""

    @functools.wraps(fn)
    def wrapper(
        *a: Any,
        job_ids: tuple[str, ...],
        queue: str | None,
        task_name: str | None,
        error: str | None,
        since: float | None,
        until: float | None,
        all_: bool,
        **kw: Any,
    ) -> Any:
        if since is not None and until is not None and since > until:
            raise click.UsageError(
                f"--since ({timestamp(since)}) is later than --until ({timestamp(until)}): "
                "nothing can match"
            )
        if error is not None:
            # the worker records built-in exceptions by their bare name
            # (ValueError), so builtins.ValueError must mean the same
            error = error.removeprefix("builtins.") or None
        f = JobFilter(
            state=State.DEAD,
            ids=tuple(dict.fromkeys(job_ids)) or None,
            queue=queue,
            name=task_name,
            error_type=error,
            since=since,
            until=until,
        )
        narrowed = any(v is not None for v in (f.ids, queue, task_name, error, since, until))
        return fn(*a, sel=Selection(f, narrowed, all_), **kw)

    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.argument("job_ids", metavar="[ID]...", nargs=-1),
        click.option("-q", "--queue", help="Only dead letters of this queue."),
        click.option(
            "-t",
            "--task",
            "task_name",
            metavar="NAME",
            help="Only this task's (with --app, a short name like send_welcome works).",
        ),
        click.option(
            "-e",
            "--error",
            metavar="TYPE",
            help="Only those whose last error is this exception type (TimeoutError, "
            "or a qualified name like myapp.errors.PaymentDeclined).",
        ),
        time_option(
            "--since", help="Only those that died at or after TIME: ISO 8601, or 30m, 2h, 1d ago."
        ),
        time_option("--until", help="Only those that died at or before TIME."),
        click.option("--all", "all_", is_flag=True, help="Every dead letter (with no filter)."),
    ]
    out: Callable[..., Any] = wrapper
    for opt in reversed(options):
        out = opt(out)
    return out  # type: ignore[return-value]


@dlq.command("ls")
@app_options
@selection
@limit_option
@cursor_option
@json_option
def ls(
    app_spec: str | None,
    url: str | None,
    sel: Selection,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List dead letters, newest first, with their last error."""
    app = resolve_app(app_spec, url)
    f = sel.on(app)
    page = call(app, lambda b: b.list_jobs(f, cursor, limit))
    empty = no_match("no dead letters", app, f.name)
    print_page(page, as_json=as_json, dead_letters=True, empty=empty)


@dlq.command("show")
@app_options
@click.argument("job_id", metavar="ID")
@json_option
def show(app_spec: str | None, url: str | None, job_id: str, as_json: bool) -> None:
    """Show one dead letter, its attempts' errors first.

    Every attempt's error (time, exception type, message, worker, traceback),
    then the envelope.
    """
    info = get_job(app_spec, url, job_id)
    if info.state is not State.DEAD:
        raise click.ClickException(
            f"job {job_id} is not a dead letter (it is {info.state}); "
            f"see it with: dumbwaiter jobs show {job_id}"
        )
    if as_json:
        print_json(job_dict(info))
    else:
        render_job(info, dead_letter=True)


@dlq.command("replay")
@app_options
@selection
def replay(app_spec: str | None, url: str | None, sel: Selection) -> None:
    """Make dead letters ready to run again, keeping their errors.

    Each gets fresh attempts; its error history stays, so a job that fails
    again shows every failure, before and after the replay.
    """
    sel.require("replay")
    app = resolve_app(app_spec, url)
    f = sel.on(app)
    n = call(app, lambda b: b.replay(f))
    click.echo(f"replayed {plural(n, 'dead letter')}")
    _unmatched(sel, n)


@dlq.command("purge")
@app_options
@selection
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(app_spec: str | None, url: str | None, sel: Selection, yes: bool) -> None:
    """Delete dead letters for good.

    Export them first if they may be needed again.  Asks for confirmation
    at a terminal, unless --yes; without a terminal (a script, a pipe,
    </dev/null) it refuses unless --yes, since nobody can be asked.
    """
    sel.require("purge")
    require_yes(yes, "purge dead letters", "delete them (export them first if they may be needed)")
    app = resolve_app(app_spec, url)
    f = sel.on(app)
    if not yes:
        n = call(app, lambda b: count(b, f))
        if n == 0:
            click.echo("no dead letters match; nothing purged")
            return
        click.confirm(f"Delete {plural(n, 'dead letter')} for good?", abort=True, err=True)
    n = call(app, lambda b: b.purge(f))
    click.echo(f"purged {plural(n, 'dead letter')}")
    _unmatched(sel, n)


def interactive() -> bool:
    """Whether a person can answer a prompt (scripts and pipes are not asked)."""
    return sys.stdin.isatty()


def require_yes(yes: bool, verb: str, to: str) -> None:
    """Refuse a destructive command that nobody confirmed.

    At a terminal the command asks; without one, only ``--yes`` says that
    the deletion is meant: a script that forgot it must fail, not delete.
    """
    if not yes and not interactive():
        raise click.UsageError(
            f"refusing to {verb} without confirmation: stdin is not a terminal, so "
            f"nobody can be asked; add --yes to {to}"
        )


def _unmatched(sel: Selection, n: int) -> None:
    ids = sel.filter.ids
    if ids is not None and n < len(ids):
        note(f"{len(ids) - n} of the {plural(len(ids), 'id')} given matched no dead letter")


async def count(b: Broker, f: JobFilter) -> int:
    """How many jobs match, a page at a time (the admin API has no count)."""
    n, cursor = 0, None
    while True:
        page = await b.list_jobs(f, cursor, PAGE)
        n += len(page.items)
        if page.cursor is None:
            return n
        cursor = page.cursor


async def write_lines(
    b: Broker, f: JobFilter, out: IO[bytes], progress: Callable[[int, int | None], None]
) -> int:
    """Write each matching job as one JSON line, a page at a time, newest first."""
    total = None
    narrowed = (f.ids, f.name, f.error_type, f.since, f.until)
    if all(v is None for v in narrowed):
        # only the queue narrows: the stats count is the total, for the progress bar
        total = sum(s.dead for s in await b.stats() if f.queue in (None, s.queue))
    n, cursor = 0, None
    while True:
        page = await b.list_jobs(f, cursor, PAGE)
        out.write(b"".join(orjson.dumps(job_dict(i)) + b"\n" for i in page.items))
        n += len(page.items)
        progress(n, total)
        if page.cursor is None:
            return n
        cursor = page.cursor


@dlq.command("export")
@app_options
@selection
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    help="File to write [default: stdout].",
)
def export(app_spec: str | None, url: str | None, sel: Selection, output: str) -> None:
    """Write dead letters as JSON lines, to stdout or a file.

    One dead letter per line: the full envelope with every attempt's error.

    The file appears only when the export is complete (it is written beside
    it under a temporary name first), so a half-written file is never mistaken
    for the whole queue.
    """
    app = resolve_app(app_spec, url)
    f = sel.on(app)
    if output == "-":
        sys.stdout.flush()
        stdout = sys.stdout.buffer
        try:
            n = call(app, lambda b: write_lines(b, f, stdout, _quiet))
            stdout.flush()
        except BrokenPipeError:  # `dlq export | head`: the reader has had enough
            _silence_stdout()
            sys.exit(1)
        note(f"exported {plural(n, 'dead letter')}")
        return
    target = os.path.abspath(output)
    # mkstemp makes the file readable by its owner only: dead letters often
    # carry personal data (addresses, payloads), so that is the right default
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.", suffix=".part"
    )
    try:
        with (
            os.fdopen(fd, "wb") as fh,
            Progress(
                TextColumn("exporting dead letters"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(stderr=True),
            ) as bar,
        ):
            task = bar.add_task("export", total=None)
            n = call(app, lambda b: write_lines(b, f, fh, _advance(bar, task)))
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    note(f"exported {plural(n, 'dead letter')} to {output}")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises no second
    BrokenPipeError (the recipe in the ``signal`` module's documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests)
        pass


def _quiet(done: int, total: int | None) -> None:
    """No progress bar when the lines go to stdout (a pipe, most likely)."""


def _advance(bar: Progress, task: TaskID) -> Callable[[int, int | None], None]:
    def update(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=max(total, done) if total is not None else None)

    return update
