"""Events on Redis: a stream per event type, a consumer group per subscriber group.

``publish`` appends each new event to the stream of its type (``ev:<type>``)
in one script call per chunk; the stream is the event log (``list_events``
reads it with XRANGE; housekeeping trims it with XTRIM MINID past the event
retention).  The subscriber groups bound to the type are consumer groups of
that stream; a worker's fetch of a group's queue reads new entries with
XREADGROUP and turns each into an ordinary job of the queue in the same
script (``scripts/_events.lua``), so leases, heartbeats, retries with
backoff, dead letters and the admin calls are the job machinery's.

An entry carries the delivery's JSON without ``id``, ``queue`` and
``max_attempts``: the script puts those three first (the delivery's own id,
the group's queue, the binding's attempts) and the rest follows unchanged,
so no JSON is parsed on the server.  ``list_events`` rebuilds the event from
the same entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson
from redis.exceptions import MovedError, NoScriptError, RedisError

from ...message import Message, encode_checked
from ...message import from_dict as message_from_dict
from ..deadline import Backoff
from .bulk import Plan
from .connection import TRANSIENT, Arg, Connection, checked

#: events per publish script call (each call holds the server for its events only)
PUBLISH_CHUNK = 1000
_STREAM_ID = re.compile(r"[0-9]+-[0-9]+")


def _entry(m: Message, limit: int | None) -> tuple[Arg, ...]:
    """One event as publish.lua takes it: id, type, run_at, priority,
    max_attempts, delivery body without id, queue and max_attempts."""
    encode_checked(m, limit)  # the size check every broker makes
    d = m.to_dict()
    del d["id"], d["queue"], d["max_attempts"]
    d["headers"] = {**m.headers, "event_id": m.id}
    eta = "" if m.eta is None else repr(m.eta)
    # text, not orjson's bytes, as a batch holds every one (see bulk.encode)
    return (m.id, m.name, eta, m.priority, m.max_attempts, orjson.dumps(d).decode())


def chunks(msgs: Iterable[Message], limit: int | None) -> list[list[Arg]]:
    """The argument lists of the publish calls (every event encoded and
    size-checked before anything is sent)."""
    out: list[list[Arg]] = []
    args: list[Arg] = []
    n = 0
    for m in msgs:
        args += _entry(m, limit)
        n += 1
        if n == PUBLISH_CHUNK:
            out.append(args)
            args, n = [], 0
    if args:
        out.append(args)
    return out


def publish(conn: Connection, chunks: list[list[Arg]]) -> Plan[int]:
    """Send each chunk (and ``WAIT`` after it with ``wait_replicas``) on one
    connection, as ``bulk.drive`` runs it; retried with backoff while
    the server is unreachable, which is safe: an event already in the log is
    skipped.  Returns the deliveries made."""
    total = 0
    lua = conn.lua.publish
    for args in chunks:
        backoff = Backoff(conn.reconnect)
        while True:
            try:
                now = repr(conn.clock.now())
                yield ("send", (b"EVALSHA", lua.sha, 1, conn.keys.tag, now, *args))
                if conn.wait_replicas:
                    yield ("send", conn.wait())
                reply = yield ("read",)
                waited = (yield ("read",)) if conn.wait_replicas else None
                if isinstance(reply, MovedError):
                    conn.target.moved(reply.host, reply.port)
                    yield ("reset",)
                    continue
                if isinstance(reply, NoScriptError):
                    yield ("send", (b"SCRIPT", b"LOAD", lua.source))
                    checked((yield ("read",)))
                    continue
                total += int(checked(reply))
                if waited is not None:
                    conn.confirmed(waited, "publish", "publishing the same events")
                break
            except TRANSIENT as exc:
                yield ("reset",)
                yield ("sleep", conn.pause_or_raise(backoff, exc, "publish"))
            except RedisError as exc:
                raise conn.failure(exc, "publish") from exc
    return total


def list_args(
    event_type: str,
    since: float | None,
    until: float | None,
    cursor: str | None,
    limit: int,
) -> list[Arg]:
    """The XRANGE bounds and exact filters of one ``list_events`` page.  Entry
    ids are publish milliseconds (never earlier than the publish time), so
    ``since`` bounds the range and the exact times filter within it."""
    start = "-" if since is None else str(int(since * 1000))
    if cursor and _STREAM_ID.fullmatch(cursor):
        start = f"({cursor}"
    stop = "+" if until is None else str(int(until * 1000))
    return [
        event_type,
        start,
        stop,
        "" if since is None else repr(since),
        "" if until is None else repr(until),
        limit,
    ]


def parse_page(r: list[Any]) -> tuple[list[Message], str | None]:
    out = []
    for i in range(1, len(r), 4):
        eid, _, attempts, body = r[i : i + 4]
        d: dict[str, Any] = orjson.loads(body)
        ident = eid.decode()
        headers = d.get("headers") or {}
        if headers.get("event_id") == ident:
            del headers["event_id"]
        d.update(id=ident, queue="", max_attempts=int(attempts), headers=headers)
        out.append(message_from_dict(d))
    return out, (r[0].decode() or None)
