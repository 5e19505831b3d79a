"""Search jobs by their argument values.

No broker indexes arguments (``JobFilter`` has no such field), so the search
runs above the seam: it reads the listing the other filters select (queue,
state, task, key, time), newest first, in pages of ``list_jobs``, and keeps
the jobs whose arguments match.  Its cost is bounded: one request looks at
``SCAN_LIMIT`` jobs at most.  When it stops there, the page says how many
it looked through and offers to go on from the last one (the cursor), so an
older match is found by going on, never by scanning everything at once.
Narrow the listing first (a task, a state, a time range) to make each look
cover more of what matters.

The query is either ``name=value`` (the argument of that name: named from
the task's signature when the app registers the task, else only keyword
arguments; ``value`` is read as JSON, so ``user_id=42`` and
``email="a@b.c"`` compare by value, and as text otherwise) or plain text,
found case-insensitively anywhere in the arguments' JSON (an event
delivery's payload).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..app import App
from ..brokers.base import Broker
from ..brokers.types import JobFilter, JobInfo
from . import queries
from .jobview import by_name

#: most jobs one search request reads
SCAN_LIMIT = 2000
#: jobs per ``list_jobs`` call while searching
SCAN_PAGE = 200

_NAMED = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$", re.S)


@dataclass(slots=True)
class Found:
    items: list[JobInfo]
    #: go on from here (None: the listing was searched to its end)
    cursor: str | None
    #: jobs looked at
    scanned: int
    #: stopped at SCAN_LIMIT, not at the end of the listing or a full page
    partial: bool


def matcher(app: App, query: str) -> Callable[[JobInfo], bool]:
    """The test a job's arguments must pass for ``query`` (see the module)."""
    named = _NAMED.match(query)
    if named is not None:
        name, text = named.group(1), named.group(2).strip()
        try:
            wanted: Any = orjson.loads(text)
        except orjson.JSONDecodeError:
            wanted = text

        def by_value(info: JobInfo) -> bool:
            m = info.message
            args = m.payload if isinstance(m.payload, dict) else by_name(app, m)
            if name not in args:
                return False
            value = args[name]
            return bool(value == wanted and type(value) is type(wanted)) or (
                isinstance(value, (str, int, float)) and not isinstance(value, bool)
                and str(value) == text
            )  # fmt: skip

        return by_value
    needle = query.strip().lower()

    def by_text(info: JobInfo) -> bool:
        m = info.message
        body = m.payload if m.payload is not None else [m.args, m.kwargs]
        text = orjson.dumps(body).decode().lower()
        return needle in text

    return by_text


async def search(
    broker: Broker,
    filters: Sequence[JobFilter],
    cursor: str | None,
    limit: int,
    test: Callable[[JobInfo], bool],
    scan_limit: int | None = None,
) -> Found:
    """Up to ``limit`` jobs of the listing ``filters`` (newest first, from
    ``cursor``) that pass ``test``, reading at most ``scan_limit`` jobs
    (default ``SCAN_LIMIT``)."""
    scan_limit = scan_limit or SCAN_LIMIT
    found: list[JobInfo] = []
    scanned = 0
    at = cursor
    while True:
        page = await queries.merged(broker, filters, at, min(SCAN_PAGE, scan_limit - scanned))
        for info in page.items:
            scanned += 1
            at = info.message.id
            if test(info):
                found.append(info)
                if len(found) >= limit:
                    more = page.cursor is not None or info is not page.items[-1]
                    return Found(found, at if more else None, scanned, False)
        if page.cursor is None:
            return Found(found, None, scanned, False)
        if scanned >= scan_limit:
            return Found(found, at, scanned, True)
