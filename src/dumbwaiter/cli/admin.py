"""``dumbwaiter stats`` and ``dumbwaiter enqueue``, and what every admin command shares.

Admin commands talk to the broker's admin API only (DESIGN §4: "Dashboard /
CLI / metrics: read Broker admin API"), so they work with a bare ``--url`` and
no task code.  Each command runs one coroutine with ``asyncio.run`` through
``call``, which always closes the broker and turns dumbwaiter's own errors
(a bad URL, a missing database directory) into a one-line message instead of
a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import orjson
from rich.text import Text

from ..app import App
from ..brokers import deadline
from ..brokers.base import Broker, QueueStats
from ..errors import DumbwaiterError, InvalidArguments
from ..message import TASK, Message, check_json, check_size, encode, uuid7
from ..task import Task
from .common import app_options, resolve_app
from .output import console, duration, print_json, table

__all__ = ["call", "enqueue", "stats"]

T = TypeVar("T")

#: attempts a job enqueued by name (no task code at hand) gets: the default Retry's
DEFAULT_MAX_ATTEMPTS = 4


def call(app: App, fn: Callable[[Broker], Awaitable[T]]) -> T:
    """Run ``fn(app.broker)`` in a fresh event loop and close the broker after.

    The broker is opened first, waiting for it no longer than a producer
    would (the App's ``enqueue_timeout``), so a command fails on a server
    that is away or refuses the URL (a wrong password, no such vhost) even
    when its own call would not talk to that server (RabbitMQ's listings
    read the state store).  ``click`` exceptions pass through; any
    ``DumbwaiterError`` becomes a ``ClickException`` so the user sees the
    message, not a traceback.
    """

    async def main() -> T:
        try:
            token = deadline.start(app.enqueue_timeout)
            try:
                await app.broker.open()
            finally:
                deadline.end(token)
            return await fn(app.broker)
        finally:
            await app.broker.close()

    try:
        return asyncio.run(main())
    except DumbwaiterError as exc:
        raise click.ClickException(str(exc)) from exc


# -- stats ---------------------------------------------------------------------


@click.command()
@app_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def stats(app_spec: str | None, url: str | None, as_json: bool) -> None:
    """Queues at a glance: depth by state, lag, paused.

    One row per queue: ready, scheduled, retrying, running, dead, succeeded, lag, paused.

    Lag is the age of the oldest ready job: how far behind the workers are.
    """
    app = resolve_app(app_spec, url)
    rows: list[QueueStats] = call(app, lambda b: b.stats())
    if as_json:
        print_json({"queues": [r.to_dict() for r in rows]})
        return
    if not rows:
        click.echo("no queues yet (nothing was enqueued on this broker)")
        return
    numbers = ("ready", "scheduled", "retrying", "running", "dead", "succeeded", "lag")
    t = table("queue", *numbers, "paused", right=numbers)
    for r in rows:
        t.add_row(
            Text(r.queue),
            str(r.ready),
            str(r.scheduled),
            str(r.retrying),
            str(r.running),
            Text(str(r.dead), style="red" if r.dead else ""),
            str(r.succeeded),
            duration(r.lag) if r.ready else "-",
            Text("paused", style="yellow") if r.paused else "",
        )
    console().print(t)


# -- enqueue ---------------------------------------------------------------------


def json_option(
    name: str, kind: type[list[Any]] | type[dict[str, Any]], help: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option holding a JSON array or object; bad JSON is a usage error naming it."""

    def convert(ctx: click.Context, param: click.Parameter, value: str) -> Any:
        try:
            # orjson, unlike json, refuses NaN/Infinity and integers over 64 bits,
            # which no engine could carry either
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise click.BadParameter(f"not valid JSON ({exc}): {value!r}", ctx, param) from None
        if not isinstance(parsed, kind):
            want = "array, e.g. '[1, \"a\"]'" if kind is list else "object, e.g. '{\"a\": 1}'"
            raise click.BadParameter(
                f"must be a JSON {want}, not a JSON {_json_kind(parsed)}", ctx, param
            )
        return parsed

    metavar = "JSON_ARRAY" if kind is list else "JSON_OBJECT"
    empty = "[]" if kind is list else "{}"
    return click.option(name, metavar=metavar, default=empty, callback=convert, help=help)


def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def find_task(app: App, name: str) -> Task:
    """The task registered as ``name``, or the only one whose name ends in ``.name``
    (so ``send_welcome`` finds ``myproject.jobs.send_welcome``)."""
    task = app.tasks.get(name)
    if task is not None:
        return task
    matches = [t for n, t in app.tasks.items() if n.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(sorted(app.tasks)) or "(none)"
    if matches:
        raise click.UsageError(
            f"task {name!r} is ambiguous: {', '.join(sorted(t.name for t in matches))}; "
            "give the full name"
        )
    raise click.UsageError(f"no task {name!r} in this app; registered tasks: {known}")


@click.command()
@app_options
@click.argument("task_name", metavar="TASK")
@json_option("--args", list, "Positional arguments, as a JSON array.")
@json_option("--kwargs", dict, "Keyword arguments, as a JSON object.")
@click.option("-q", "--queue", help="Queue [default: the task's, or 'default' without --app].")
@click.option("--delay", type=click.FloatRange(min=0), help="Seconds to wait before it may run.")
@click.option("--priority", type=int, help="Higher runs first [default: the task's, or 0].")
@click.option("--key", help="Uniqueness key: no second job with it while one is stored.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead of the id.')
def enqueue(
    app_spec: str | None,
    url: str | None,
    task_name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str | None,
    delay: float | None,
    priority: int | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Enqueue a job of TASK and print its id.

    With --app the task must be registered, and the arguments are checked
    against its signature before anything is stored.  With only --url the job
    is stored by name as given (a worker that does not know it dead-letters it).

    \b
    dumbwaiter enqueue myproject.jobs.send_welcome --args '[42]' --app myproject.jobs:app
    """
    if key == "":
        raise click.BadParameter("must not be empty", param_hint="--key")
    if queue == "":
        raise click.BadParameter("must not be empty", param_hint="--queue")
    app = resolve_app(app_spec, url)
    if app_spec:
        task = find_task(app, task_name)
        opts = {
            k: v
            for k, v in (("queue", queue), ("delay", delay), ("priority", priority), ("key", key))
            if v is not None
        }

        async def send_task(_: Broker) -> str:
            try:
                job = await task.options(**opts).aenqueue(*args, **kwargs)
            except InvalidArguments as exc:
                raise click.UsageError(str(exc)) from exc
            return job.id

        job_id = call(app, send_task)
    else:
        msg = _message(app, task_name, args, kwargs, queue, delay, priority, key)

        async def send_message(broker: Broker) -> str:
            return (await broker.enqueue([msg]))[0]

        job_id = call(app, send_message)
    if as_json:
        print_json({"id": job_id})
    else:
        click.echo(job_id)


def _message(
    app: App,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str | None,
    delay: float | None,
    priority: int | None,
    key: str | None,
) -> Message:
    """The envelope ``Task.message`` would build, for a task known only by name."""
    now = time.time()
    msg = Message(
        id=uuid7(),
        kind=TASK,
        name=name,
        queue=queue or "default",
        args=args,
        kwargs=kwargs,
        max_attempts=DEFAULT_MAX_ATTEMPTS,
        created_at=now,
        eta=now + delay if delay else None,
        priority=priority or 0,
        key=key,
    )
    try:
        check_json(args, "--args")
        check_json(kwargs, "--kwargs")
        if app.max_message_size is not None:
            check_size(len(encode(msg)), app.max_message_size, f"a message of task {name}")
    except DumbwaiterError as exc:
        raise click.UsageError(str(exc)) from exc
    return msg
