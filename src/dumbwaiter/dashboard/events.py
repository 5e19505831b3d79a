"""The events page's reads: recent events of each type, their payload, and
what each subscriber group did with them.

* **Recent events**: ``list_events`` pages a type's log oldest first, within
  a publish-time range.  The newest events are found by looking back from
  now through growing windows (a minute, ten, a hundred...): a window with
  more events than one call returns (``LOOK_PAGE``) is narrowed instead.
  One type costs at most ``MAX_CALLS`` calls however long the log is (on
  RabbitMQ, where the log is read whole per call, that many reads of it);
  the "every type" view looks at ``MAX_TYPES`` types at most.
* **Which groups handled them**: each delivery is a job in a group's queue
  (``group:NAME``) whose ``headers["event_id"]`` is the event's id.  One
  ``list_jobs`` per group (its newest ``DELIVERY_SCAN`` deliveries since the
  oldest event shown) gives each delivery's state; the group's inbox marks
  (``inbox:QUEUE:EVENT_ID``, written when a delivery succeeded) say
  "handled" for deliveries already pruned or beyond that scan.
* **Which types exist**: the app's event classes and subscriptions, and the
  types of the newest deliveries in each group's queue (so a dashboard run
  from a bare broker URL finds the types that have subscribers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..app import App
from ..brokers.base import Broker
from ..brokers.types import JobFilter, JobInfo, QueueStats
from ..message import GROUP_PREFIX, Message
from ..settle import inbox_entry

#: events one call returns while looking for the newest
LOOK_PAGE = 500
#: most ``list_events`` calls the look at one type makes
MAX_CALLS = 12
#: the first window looked at, in seconds back from now
FIRST_WINDOW = 60.0
#: the narrowest window: more than ``LOOK_PAGE`` events in it are cut to that many
MIN_WINDOW = 0.001
#: types the "every type" view merges
MAX_TYPES = 12
#: deliveries read per group to find the events' deliveries
DELIVERY_SCAN = 500
#: deliveries per group queue read to discover event types without code
DISCOVER = 100


@dataclass(slots=True)
class EventType:
    name: str
    #: groups subscribed (in this app's code, or seen delivering this type)
    groups: list[str] = field(default_factory=list)
    #: schema versions of the event classes this process imports
    versions: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Handling:
    """What one group did with one event."""

    group: str
    #: a delivery's state, "handled" (only the inbox mark is left), or "not seen"
    status: str
    job: str | None = None


@dataclass(slots=True)
class Row:
    event: Message
    handling: list[Handling]


@dataclass(slots=True)
class Recent:
    rows: list[Row]
    #: look further back from here (publish time) for older events; None: no more
    older: float | None
    types_looked: int
    types_known: int


async def known_types(app: App, broker: Broker, stats: Iterable[QueueStats]) -> list[EventType]:
    from ..event import REGISTRY

    found: dict[str, EventType] = {}

    def get(name: str) -> EventType:
        return found.setdefault(name, EventType(name))

    for event_type, version in REGISTRY:
        t = get(event_type)
        t.versions = sorted({*t.versions, version})
    for _queue, event_type in app.subscriptions:
        sub = app.subscriptions[(_queue, event_type)]
        if sub.group not in get(event_type).groups:
            get(event_type).groups.append(sub.group)
    group_queues = [s.queue for s in stats if s.queue.startswith(GROUP_PREFIX)]
    pages = await asyncio.gather(
        *(broker.list_jobs(JobFilter(queue=q), None, DISCOVER) for q in group_queues)
    )
    for q, page in zip(group_queues, pages, strict=True):
        group = q.removeprefix(GROUP_PREFIX)
        for info in page.items:
            t = get(info.message.name)
            if group not in t.groups:
                t.groups.append(group)
    for t in found.values():
        t.groups.sort()
    return sorted(found.values(), key=lambda t: t.name)


async def newest(
    broker: Broker,
    event_type: str,
    limit: int,
    until: float | None,
    floor: float,
    now: float,
) -> tuple[list[Message], float | None]:
    """The newest ``limit`` events of ``event_type`` published in
    ``[floor, until]`` (``until`` None: up to now and beyond, for a publisher
    whose clock is ahead), newest first, and where to look on from (the
    publish time to pass as ``until`` for older ones; None when the range is
    done)."""
    hi = until
    width = FIRST_WINDOW
    got: dict[str, Message] = {}
    calls = 0
    while calls < MAX_CALLS and len(got) < limit:
        top = hi if hi is not None else now
        if top <= floor:
            break
        lo = max(top - width, floor)
        page, more = await broker.list_events(event_type, lo, hi, None, LOOK_PAGE)
        calls += 1
        if more is not None and top - lo > MIN_WINDOW:
            # more than one call returns: a narrower window, as wide as half of
            # the time this page's events (the window's oldest) spread over
            spread = page[-1].created_at - page[0].created_at if page else 0.0
            width = min(max(spread / 2, MIN_WINDOW), (top - lo) / 2)
            continue
        while more is not None and calls < MAX_CALLS:  # the narrowest window: read it on
            for m in page:
                got[m.id] = m
            page, more = await broker.list_events(event_type, lo, hi, more, LOOK_PAGE)
            calls += 1
        for m in page:
            got[m.id] = m
        hi = lo
        # the next window: wider, by what this one's density allows (half a call)
        grow = width * 10
        if page:
            grow = min(grow, max(width, width * (LOOK_PAGE / 2) / len(page)))
        width = grow
    items = sorted(got.values(), key=lambda m: m.id, reverse=True)
    if len(items) > limit:
        items = items[:limit]
        return items, items[-1].created_at
    if hi is None:
        hi = now
    return items, (hi if hi > floor else None)


async def recent(
    app: App,
    broker: Broker,
    types: Sequence[EventType],
    limit: int,
    until: float | None,
    now: float | None = None,
) -> Recent:
    """The newest events of ``types`` (merged, newest first) and what each
    group did with them."""
    now = time.time() if now is None else now
    floor = now - app.event_retention
    looked = list(types[:MAX_TYPES])
    found = await asyncio.gather(
        *(newest(broker, t.name, limit, until, floor, now) for t in looked)
    )
    events = sorted((m for ms, _ in found for m in ms), key=lambda m: m.id, reverse=True)
    ends = [o for _, o in found if o is not None]
    if len(events) > limit:
        events = events[:limit]
        ends.append(events[-1].created_at)
    # on from the latest point any type stopped at: an event may show twice
    # across pages, none is skipped
    older = max(ends) if ends else None
    groups = {t.name: t.groups for t in types}
    return Recent(await handling(broker, events, groups), older, len(looked), len(types))


async def handling(
    broker: Broker, events: Sequence[Message], groups: dict[str, list[str]]
) -> list[Row]:
    if not events:
        return []
    involved = sorted({g for e in events for g in groups.get(e.name, [])})
    oldest = min(e.created_at for e in events)
    pages = await asyncio.gather(
        *(
            broker.list_jobs(
                JobFilter(queue=GROUP_PREFIX + g, since=oldest - 1.0), None, DELIVERY_SCAN
            )
            for g in involved
        )
    )
    deliveries: dict[tuple[str, str], JobInfo] = {}
    for g, page in zip(involved, pages, strict=True):
        for info in page.items:  # newest first: keep the newest delivery (a replay's)
            event_id = str(info.message.headers.get("event_id") or "")
            deliveries.setdefault((g, event_id), info)
    keys = {
        inbox_entry(GROUP_PREFIX + g, e.id): (g, e.id)
        for e in events
        for g in groups.get(e.name, [])
    }
    marks = await broker.kv_get(list(keys)) if keys else {}
    handled = {keys[k] for k in marks}
    rows = []
    for e in events:
        out = []
        for g in groups.get(e.name, []):
            d = deliveries.get((g, e.id))
            if d is not None:
                out.append(Handling(g, str(d.state), d.message.id))
            elif (g, e.id) in handled:
                out.append(Handling(g, "handled"))
            else:
                out.append(Handling(g, "not seen"))
        rows.append(Row(e, out))
    return rows
