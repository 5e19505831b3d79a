"""``dumbwaiter events ls | schema | lock | check | replay`` and ``dumbwaiter publish``.

The contract commands read the event classes the app's module imports
(``--app``); ``check`` is meant for CI: it exits 1 with a readable report when
an event changed incompatibly without a version bump.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson
import pydantic

from ..brokers.base import Broker
from ..contracts import check as check_contract
from ..contracts import lock_document, schemas
from ..errors import DumbwaiterError
from ..event import REGISTRY, Event, event_message_of, replay
from ..message import Message
from .admin import call, json_option
from .common import app_option, app_options, require_app, resolve_app
from .output import console, note, plural, print_json, table, time_option

LOCK_FILE = "events.lock.json"


@click.group()
def events() -> None:
    """Event types, their schemas and contracts, and replay from the log."""


@events.command("ls")
@app_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def ls(app_spec: str | None, as_json: bool) -> None:
    """Every event type the app knows: versions, class, subscriber groups."""
    app = require_app(app_spec)
    groups: dict[str, list[str]] = {}
    for queue, etype in sorted(app.subscriptions):
        groups.setdefault(etype, []).append(app.subscriptions[(queue, etype)].group)
    rows: list[dict[str, Any]] = []
    for etype in sorted({t for t, _ in REGISTRY}):
        versions = sorted(v for t, v in REGISTRY if t == etype)
        newest = REGISTRY[(etype, versions[-1])]
        rows.append(
            {
                "type": etype,
                "versions": versions,
                "class": f"{newest.__module__}.{newest.__qualname__}",
                "groups": groups.get(etype, []),
            }
        )
    if as_json:
        print_json({"events": rows})
        return
    if not rows:
        click.echo("no event classes are imported by this app")
        return
    t = table("type", "versions", "class", "groups")
    for r in rows:
        t.add_row(
            r["type"],
            ", ".join(map(str, r["versions"])),
            r["class"],
            ", ".join(r["groups"]) or "-",
        )
    console().print(t)


@events.command("schema")
@app_option
@click.argument("event_type", required=False)
def schema(app_spec: str | None, event_type: str | None) -> None:
    """Print the JSON Schema of every event type (or of EVENT_TYPE), by version."""
    require_app(app_spec)
    found = schemas()
    if event_type is not None:
        if event_type not in found:
            raise click.UsageError(_unknown(event_type))
        found = {event_type: found[event_type]}
    print_json(found)


@events.command("lock")
@app_option
@click.option("--file", "path", default=LOCK_FILE, show_default=True, type=click.Path())
def lock(app_spec: str | None, path: str) -> None:
    """Write the lock file: every event type and version with its schema."""
    require_app(app_spec)
    doc = lock_document()
    Path(path).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    n = sum(len(v) for v in doc["events"].values())
    note(f"wrote {path}: {plural(len(doc['events']), 'event type')}, {plural(n, 'version')}")


@events.command("check")
@app_option
@click.option("--file", "path", default=LOCK_FILE, show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(app_spec: str | None, path: str, as_json: bool) -> None:
    """Fail (exit 1) on an incompatible event change made without a version bump.

    Compares the app's event classes with the lock file: a removed or renamed
    field, a changed type or a new required field in a version that exists in
    the lock is incompatible.  Run it in CI; after a deliberate change, bump
    the version, add an upcaster and run `dumbwaiter events lock`."""
    app = require_app(app_spec)
    try:
        locked = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise click.UsageError(f"no lock file {path}: run `dumbwaiter events lock` first") from None
    except orjson.JSONDecodeError as exc:
        raise click.UsageError(f"{path} is not JSON: {exc}") from None
    report = check_contract(locked, upcasters=set(app.upcasters))
    if as_json:
        print_json(report.to_dict())
    else:
        for p in report.problems:
            click.echo(f"INCOMPATIBLE  {p}")
        for n in report.notes:
            click.echo(f"note          {n}")
        click.echo(
            "event contracts: OK"
            if report.ok
            else f"event contracts: {plural(len(report.problems), 'incompatible change')}"
        )
    if not report.ok:
        raise SystemExit(1)


@events.command("replay")
@app_option
@click.argument("event_type")
@click.option("--group", "-g", required=True, help="The subscriber group to deliver to.")
@time_option("--since", "Only events published at or after TIME (ISO 8601, or 2h, 1d ago).")
@time_option("--until", "Only events published at or before TIME.")
@click.option(
    "--force",
    is_flag=True,
    help="Run handlers even for events the group already handled (rebuild a projection).",
)
def replay_cmd(
    app_spec: str | None,
    event_type: str,
    group: str,
    since: float | None,
    until: float | None,
    force: bool,
) -> None:
    """Deliver logged events of EVENT_TYPE again to one group.

    For a new consumer, or after fixing a bug.  Events the group already
    handled are acked without running (its inbox), unless --force."""
    app = require_app(app_spec)
    n = call(
        app,
        lambda _: replay(app, event_type, group, since=since, until=until, force=force),
    )
    click.echo(f"{plural(n, 'event')} of {event_type} delivered again to group {group}")


@click.command()
@app_options
@click.argument("event_type")
@json_option("--payload", dict, "The event's fields, a JSON object.")
@click.option(
    "--event-version",
    "version",
    type=click.IntRange(min=1),
    default=None,
    help="The schema version of the payload [default with --app: the newest class's; "
    "required with only --url].",
)
@click.option("--key", default=None, help="Ordering key (e.g. the entity's id).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
def publish(
    app_spec: str | None,
    url: str | None,
    event_type: str,
    payload: dict[str, Any],
    version: int | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Publish an event of EVENT_TYPE to every subscriber group.

    With --app the payload is validated first, against the event class of
    its version.  With only --url no class is at hand: the event is
    published as given, in --event-version, and each group's handler
    validates it (one that does not fit is dead-lettered in that group).
    """
    if key == "":
        raise click.BadParameter("must not be empty", param_hint="--key")
    if app_spec:
        app = require_app(app_spec)
        event = _validated(event_type, payload, version)
        version = event.event_version
        event_id = call(app, lambda _: app.apublish(event, key=key))
    elif version is None:
        raise click.UsageError(
            "with only --url, give --event-version N: the schema version the payload is in "
            "(subscribers upgrade older versions from it); or give --app to validate it"
        )
    else:
        app = resolve_app(None, url)
        try:
            msg = event_message_of(event_type, version, payload, key, None)
        except DumbwaiterError as exc:
            raise click.UsageError(str(exc)) from exc
        event_id = call(app, lambda b: _publish(b, msg))
    if as_json:
        print_json({"id": event_id, "type": event_type, "version": version})
    else:
        click.echo(event_id)


async def _publish(broker: Broker, msg: Message) -> str:
    await broker.publish([msg])
    return msg.id


def _validated(event_type: str, payload: dict[str, Any], version: int | None) -> Event:
    """``payload`` as the app's class of ``event_type`` (``version``, or the newest)."""
    versions = sorted(v for t, v in REGISTRY if t == event_type)
    if not versions:
        raise click.UsageError(_unknown(event_type))
    if version is None:
        version = versions[-1]
    elif version not in versions:
        raise click.UsageError(
            f"event {event_type!r} has no version {version} in this app; "
            f"its versions: {', '.join(map(str, versions))}"
        )
    cls: type[Event] = REGISTRY[(event_type, version)]
    try:
        return cls.model_validate(payload)
    except pydantic.ValidationError as exc:
        raise click.UsageError(f"the payload is not a valid {event_type}: {exc}") from None


def _unknown(event_type: str) -> str:
    known = sorted({t for t, _ in REGISTRY})
    return f"no event class of type {event_type!r} is imported; known: {', '.join(known) or 'none'}"
