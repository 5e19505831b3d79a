"""``ctx.wait_for_event``: waiters in the store, and the router that wakes them.

A wait registers a *waiter* under its event type, indexed by what it
matches: ``match={"user_id": 42}`` has the shape ``["user_id"]`` and the
values ``[42]``, and the waiter's key is
``wfwait:TYPE:hash(shape):hash(values):RUN:POS``.  The shapes in use are
listed under ``wfshape:TYPE:``.

Events reach waiters through an internal subscriber group,
``dw.workflows``: the first wait for a type binds that type to the group's
queue (``broker.declare``, persistent and idempotent), and every worker of
an app with workflows consumes the queue.  The router handles each
delivery: for each shape of the type it reads the waiters whose values
equal the event's, by one prefix scan, writes the event as the checkpoint
of each waiting position (``kv_add``: the first of an event, a timeout and
a signal wins) and wakes the run.  A redelivered event finds its own
checkpoint and wakes the run again (harmless: see ``jobs.wake``), so a
router that dies between the two loses nothing.

This is above the broker seam: the same on every engine with events.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..brokers.types import Binding
from ..errors import ConfigurationError
from ..message import GROUP_PREFIX, Message, check_json
from ..retry import Retry
from ..task import Task
from . import store
from .jobs import wake
from .store import FINAL, SHAPE, WAITER

if TYPE_CHECKING:
    from ..context import Context
    from .host import Host

log = logging.getLogger("dumbwaiter.durable")

#: the internal subscriber group whose queue the router consumes
ROUTER_GROUP = "dw.workflows"
ROUTER_QUEUE = GROUP_PREFIX + ROUTER_GROUP
ROUTER_RETRY = Retry(attempts=10, backoff=(1.0, 5.0, 30.0))

_MISSING = object()


def check_match(match: Any, event_type: str) -> dict[str, Any]:
    """``match=`` as stored: payload field (dotted for nested ones) -> the
    value it must equal.  Checked at the call, since it is stored."""
    if match is None:
        return {}
    if not isinstance(match, dict) or not all(isinstance(k, str) and k for k in match):
        raise ConfigurationError(
            f"wait_for_event({event_type}): match= takes a dict of payload field -> value "
            f"(e.g. {{'user_id': 42}}), got {match!r}"
        )
    check_json(match, f"match= of wait_for_event({event_type})")
    return dict(match)


def _field(payload: Any, path: str) -> Any:
    value = payload
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def waiter_prefix(event_type: str, fields: list[str], values: list[Any]) -> str:
    return f"{WAITER}{event_type}:{store.short_hash(fields)}:{store.short_hash(values)}:"


def waiter_key(event_type: str, match: dict[str, Any], run: str, pos: int) -> str:
    fields = sorted(match)
    return f"{waiter_prefix(event_type, fields, [match[f] for f in fields])}{run}:{pos:06d}"


async def ensure_binding(app: Host, event_type: str) -> None:
    """Bind ``event_type`` to the router's queue (once per process and type)."""
    done: set[str] = app.__dict__.setdefault("_durable_bound", set())
    if event_type in done:
        return
    if not app.broker.capabilities.events:
        raise ConfigurationError(
            f"wait_for_event needs events; the {type(app.broker).__name__} broker has none"
        )
    await app.broker.declare(
        [ROUTER_QUEUE], [Binding(event_type, ROUTER_QUEUE, ROUTER_RETRY.attempts)]
    )
    done.add(event_type)


async def register(
    app: Host,
    run: str,
    pos: int,
    name: str,
    event_type: str,
    version: int,
    match: dict[str, Any],
    deadline: float | None,
) -> None:
    """Make the run at ``pos`` a waiter of ``event_type`` (idempotent)."""
    await ensure_binding(app, event_type)
    fields = sorted(match)
    shapes: set[str] = app.__dict__.setdefault("_durable_shapes", set())
    shape_key = f"{SHAPE}{event_type}:{store.short_hash(fields)}"
    if shape_key not in shapes:
        await app.broker.kv_set({shape_key: store.dumps(fields)})
        shapes.add(shape_key)
    ttl = None if deadline is None else max(deadline - time.time(), 0.0) + 86400.0
    value = {
        "run": run,
        "pos": pos,
        "name": name,
        "match": match,
        "version": version,
        "deadline": deadline,
    }
    await app.broker.kv_set({waiter_key(event_type, match, run, pos): store.dumps(value)}, ttl=ttl)


async def unregister(app: Host, event_type: str, match: dict[str, Any], run: str, pos: int) -> None:
    await app.broker.kv_delete([waiter_key(event_type, match, run, pos)])


async def resolve(
    app: Host, run: str, pos: int, name: str, value: dict[str, Any], source: str
) -> bool:
    """Write ``value`` (an event's payload, or a signal's) as the checkpoint of
    the wait at ``pos`` and wake the run.  False when the wait had already
    ended otherwise (a timeout, another event); True also when this same
    ``source`` (an event id) had resolved it before: a redelivery wakes the
    run again, in case the first delivery died before it could."""
    ck = {"n": name, "k": "event", "v": value, "src": source, "t1": time.time()}
    key = store.ck_key(run, pos)
    if not await app.broker.kv_add(key, store.dumps(ck)):
        held = store.loads((await app.broker.kv_get([key])).get(key))
        if not isinstance(held, dict) or held.get("src") != source:
            return False
    await wake(app, run, pos)
    return True


async def deliver(app: Host, msg: Message) -> int:
    """The router: resume every run waiting for this event.  Returns how many."""
    payload = msg.payload if isinstance(msg.payload, dict) else {}
    event_type = msg.name
    event_id = str(msg.headers.get("event_id") or msg.id)
    try:
        version = int(msg.headers.get("schema_version", 1))
    except (TypeError, ValueError):
        version = 1
    broker = app.broker
    shapes = await broker.kv_scan(f"{SHAPE}{event_type}:")
    resumed = 0
    for raw in shapes.values():
        fields = [str(f) for f in store.loads(raw) or []]
        values = [_field(payload, f) for f in fields]
        if any(v is _MISSING for v in values):
            continue
        for key, wraw in (await broker.kv_scan(waiter_prefix(event_type, fields, values))).items():
            w = store.loads(wraw)
            if not isinstance(w, dict):
                continue
            body = payload
            wanted = int(w.get("version") or 1)
            if version < wanted:
                try:
                    body = app.upgrade(event_type, version, wanted, dict(payload))
                except Exception:
                    log.exception("event %s cannot be upgraded for run %s", event_id, w.get("run"))
                    continue
            if any(_field(body, f) != v for f, v in (w.get("match") or {}).items()):
                continue  # two values with one digest: not this waiter's event
            run, pos = str(w["run"]), int(w["pos"])
            rec = await store.load(broker, run)
            if rec is None or rec.get("status") in FINAL:
                await broker.kv_delete([key])
                continue
            if await resolve(app, run, pos, str(w.get("name", "")), body, event_id):
                resumed += 1
            await broker.kv_delete([key])
    return resumed


def router_task(app: Host) -> Task[..., Any]:
    """The handler of the router's queue, as the worker runs it: a task whose
    function reads the delivered event from its context."""

    async def route(ctx: Context) -> None:
        await deliver(app, ctx.message)

    return Task(
        app,
        route,
        name=f"dw.workflows.router@{ROUTER_GROUP}",
        queue=ROUTER_QUEUE,
        retry=ROUTER_RETRY,
        timeout=None,
        priority=0,
        keep_result=None,
        options={},
    )
