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
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import click
from rich.text import Text

from ..app import App
from ..brokers import deadline
from ..brokers.base import Broker
from ..brokers.partitions import PartitionLag
from ..brokers.types import QueueStats
from ..errors import ConfigurationError, DumbwaiterError, InvalidArguments, SerializationError
from ..message import TASK, Message, check_json, check_size, encode, uuid7
from ..metrics import queue_stats
from ..scaling import DEFAULT_DRAIN_TARGET, DRAIN_TARGET_ENV, scales
from ..task import Task, full_name
from .common import app_options, resolve_app
from .output import console, duration, print_json, table

__all__ = ["call", "enqueue", "no_match", "stats", "task_filter"]

T = TypeVar("T")

#: attempts a job enqueued by name (no task code at hand) gets: the default Retry's
DEFAULT_MAX_ATTEMPTS = 4


def call(app: App, fn: Callable[[Broker], Awaitable[T]], *, open_first: bool = True) -> T:
    """Run ``fn(app.broker)`` in a fresh event loop and close the broker after.

    The broker is opened first, waiting for it no longer than a producer
    would (the App's ``enqueue_timeout``), so a command fails on a server
    that is away or refuses the URL (a wrong password, no such vhost) even
    when its own call would not talk to that server (RabbitMQ's listings
    read the state store).  ``click`` exceptions pass through; any
    ``DumbwaiterError`` becomes a ``ClickException`` so the user sees the
    message, not a traceback.  ``open_first=False`` skips the open, for a
    call that must not claim anything on the broker first (RabbitMQ's open
    announces the state store, which ``state reset-identity`` is there to
    change).
    """

    async def main() -> T:
        try:
            if open_first:
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
@click.option(
    "--drain-target",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Seconds in which ready jobs should be cleared, for the desired workers "
    f"(default: ${DRAIN_TARGET_ENV}, else {DEFAULT_DRAIN_TARGET:g}).",
)
def stats(app_spec: str | None, url: str | None, as_json: bool, drain_target: float | None) -> None:
    """Queues at a glance: depth by state, lag, paused, and the workers each needs.

    One row per queue: ready, scheduled, retrying, running, prefetched, dead,
    succeeded, lag, workers, want, paused.

    Running jobs are being run by a handler; prefetched ones are leased by a
    worker and wait in its buffer for a free slot (the workers' count at
    their last heartbeat).  Lag is the age of the oldest ready job: how far
    behind the workers are.  Workers are the live ones on the queue; want is
    how many it needs now (its busy slots plus the slots that clear its
    ready jobs within the drain target: docs/metrics.md), the number an
    autoscaler targets.  On a partitioned log (Kafka) a second table gives
    each queue's partitions: end offset, committed offset, lag.
    """
    app = resolve_app(app_spec, url)

    async def read(
        b: Broker,
    ) -> tuple[tuple[list[QueueStats], list[dict[str, Any]]], list[PartitionLag]]:
        return await queue_stats(b), await b.partition_lag()

    (rows, workers), parts = call(app, read)
    figures = scales(rows, workers, drain_target)
    if as_json:
        pairs = zip(rows, figures, strict=True)
        out: dict[str, Any] = {"queues": [r.to_dict() | f.to_dict() for r, f in pairs]}
        if parts:  # a partitioned log's (Kafka)
            out["partitions"] = [p.to_dict() for p in parts]
        print_json(out)
        return
    if not rows:
        click.echo("no queues yet (nothing was enqueued on this broker)")
        return
    numbers = (
        "ready",
        "scheduled",
        "retrying",
        "running",
        "prefetched",
        "dead",
        "succeeded",
        "lag",
        "workers",
        "want",
    )
    t = table("queue", *numbers, "paused", right=numbers)
    for r, f in zip(rows, figures, strict=True):
        short = f.desired_workers > f.workers
        t.add_row(
            Text(r.queue),
            str(r.ready),
            str(r.scheduled),
            str(r.retrying),
            str(r.running),
            str(r.prefetched),
            Text(str(r.dead), style="red" if r.dead else ""),
            str(r.succeeded),
            duration(r.lag) if r.ready else "-",
            str(f.workers),
            Text(str(f.desired_workers), style="yellow" if short else ""),
            Text("paused", style="yellow") if r.paused else "",
        )
    console().print(t)
    if parts:
        console().print(_partition_table(parts))


def _partition_table(parts: list[PartitionLag]) -> Any:
    """Each queue's partitions: end offset, committed offset, lag."""
    numbers = ("partition", "end", "committed", "lag")
    t = table("queue", *numbers, right=numbers)
    for p in parts:
        t.add_row(Text(p.queue), str(p.partition), str(p.end), str(p.committed), str(p.lag))
    return t


# -- enqueue ---------------------------------------------------------------------


def json_option(
    name: str, kind: type[list[Any]] | type[dict[str, Any]], help: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option holding a JSON array or object; bad JSON is a usage error naming it."""

    def convert(ctx: click.Context, param: click.Parameter, value: str) -> Any:
        try:
            parsed = _exact_json(value)
        except ValueError as exc:
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


def _exact_json(text: str) -> Any:
    """Parse JSON keeping every integer exact, so the API's checks see what was typed.

    Not orjson: it reads an integer beyond 64 bits as a float, so
    ``[18446744073709551616]`` would reach the task as ``1.8446744073709552e+19``
    where ``task.enqueue(2**64)`` is refused.  The standard library keeps the
    integer (``check_json`` then refuses it with the API's own error) and is
    told to refuse NaN and Infinity, which are not JSON, and a number too big
    for a double, which it would read as Infinity.
    """

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    def finite(digits: str) -> float:
        value = float(digits)
        if not math.isfinite(value):
            raise ValueError(f"{digits} is beyond a double's range")
        return value

    return json.loads(text, parse_constant=no_constant, parse_float=finite)


def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def find_task(app: App, name: str) -> Task:
    """The task registered as ``name``, or the only one whose name ends in ``.name``
    (so ``send_welcome`` finds ``myproject.jobs.send_welcome``)."""
    task = app.tasks.get(task_filter(app, name))
    if task is None:
        known = ", ".join(sorted(app.tasks)) or "(none)"
        raise click.UsageError(f"no task {name!r} in this app; registered tasks: {known}")
    return task


@overload
def task_filter(app: App, name: str) -> str: ...
@overload
def task_filter(app: App, name: None) -> None: ...
def task_filter(app: App, name: str | None) -> str | None:
    """``--task NAME`` as stored (``task.full_name``: a short name means the
    app's one task ending in it); an ambiguous short name is a usage error."""
    if name is None:
        return None
    try:
        return full_name(app, name)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None


def no_match(what: str, app: App, name: str | None) -> str:
    """ "no jobs match", with a hint when a short task name met no app to expand it."""
    if name is not None and "." not in name and not app.tasks:
        return (
            f"{what} match (task names are matched in full, e.g. myproject.jobs.{name}; "
            "with --app a short name finds the app's task)"
        )
    return f"{what} match"


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
            except (InvalidArguments, SerializationError) as exc:
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
