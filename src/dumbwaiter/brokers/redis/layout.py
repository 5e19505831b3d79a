"""How an app's keys are spread over Redis hash tags (the URL's ``layout=``).

``app`` (the default): every key of the app under one tag, ``{dw:NAME}``.
One slot, so on a Redis Cluster the whole app lives on one primary; every
cross-queue guarantee holds as one script (a bulk enqueue over several
queues is all or nothing, a unique key blocks in every queue).

``queues``: each queue's keys under a tag of its own, ``{dw:NAME/q:QUEUE}``
(its ready and scheduled sets, its running leases, its jobs, its dead and
finished jobs, its unique keys, its waiters), so a cluster spreads an app's
queues over its primaries and each one's scripts run on the node that owns
its slot.  What spans queues stays in the home tag ``{dw:NAME}``: the event
streams with their subscriber groups' queues (``group:*``: a fetch turns a
stream's entries into the group's jobs in one script), the key-value store,
locks (the scheduler's lease), rate and concurrency limits, and the list of
the app's queues (``queues``, for stats and admin walks).  What that costs:
a unique key blocks within its queue only; a bulk enqueue over several
queues is all or nothing per queue; a worker on several queues asks each of
their keyspaces in turn and, when all are idle, waits on each at once (one
connection per keyspace); ``get``, ``cancel``, ``reschedule`` by id ask every
keyspace (the id does not name its queue), concurrently.

The layout an app was first written with is recorded in ``{dw:NAME}:layout``
and a process configured otherwise refuses to start against it: the two
would not see each other's jobs.  Keys written before that record existed
(the ``app`` layout) count as ``app``.  Nothing is migrated: drain the app
(or purge it) before changing its layout.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ...errors import BrokerConfigError
from ...redact import mask_url

APP = "app"
QUEUES = "queues"
LAYOUTS = (APP, QUEUES)
#: queues that stay in the home keyspace whatever the layout: subscriber
#: groups' (message.GROUP_PREFIX), whose fetch reads the event streams
HOME_PREFIX = "group:"
#: a prefix may not contain this: it separates the app from the queue in a
#: queue's tag, and two apps must never share one
SEPARATOR = "/q:"


def keyspace_name(app: str, queue: str) -> str:
    """The name (inside ``{dw:...}``) of ``queue``'s own keyspace."""
    return f"{app}{SEPARATOR}{queue}"


def marker(tag: str) -> str:
    return f"{tag}:layout"


def _legacy(tag: str) -> tuple[str, ...]:
    """Keys an app written before the layout record has (the ``app`` layout)."""
    return (f"{tag}:ids", f"{tag}:queues", f"{tag}:fence")


def refuse(url: str, tag: str, found: str, wanted: str) -> BrokerConfigError:
    return BrokerConfigError(
        f"redis {mask_url(url)}: the app {tag} was written with layout={found}, and this "
        f"process is configured with layout={wanted}; the two would not see each other's "
        f"jobs, so it refuses to start.  Use layout={found} in the URL, or drain and purge "
        f"the app's jobs and delete {marker(tag)} before changing its layout "
        "(nothing is migrated: docs/redis.md, 'Key layout')"
    )


def _steps(tag: str, wanted: str) -> Generator[tuple[bytes | str, ...], Any, Any]:
    """The commands of a check, each sent by the caller's link (which
    follows ``MOVED``): the recorded layout, recorded first if none is."""
    found = yield (b"GET", marker(tag))
    if found is None:
        old = int((yield (b"EXISTS", *_legacy(tag))))
        yield (b"SET", marker(tag), APP if old else wanted, b"NX")
        found = yield (b"GET", marker(tag))
    return found


def _judge(url: str, tag: str, found: Any, wanted: str) -> None:
    if found is not None and found.decode() != wanted:
        raise refuse(url, tag, found.decode(), wanted)


async def check(link: Any, url: str, tag: str, wanted: str) -> None:
    """Record the layout if the app has none yet; refuse a different one."""
    steps, reply = _steps(tag, wanted), None
    try:
        while True:
            reply = await link.call(*steps.send(reply))
    except StopIteration as stop:
        _judge(url, tag, stop.value, wanted)


def check_sync(link: Any, url: str, tag: str, wanted: str) -> None:
    """``check`` on a ``SyncLink``, for producers without an event loop."""
    steps, reply = _steps(tag, wanted), None
    try:
        while True:
            reply = link.call(*steps.send(reply))
    except StopIteration as stop:
        _judge(url, tag, stop.value, wanted)
