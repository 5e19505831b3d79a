"""The dashboard's reads: pages of jobs, built from ``list_jobs`` cursors only.

Every listing is a bounded number of ``list_jobs`` calls of one page each,
so a request costs the same with a thousand jobs stored or ten million.

A listing over several queues or states (the dead letters of every queue,
a queue's jobs in every state) is a *merge*: one page per (queue, state),
each served by the engines' ``(queue, state, id)`` index, merged newest
first.  Job ids are UUIDv7 and every engine pages by ``id < cursor``, so the
last id shown is a valid cursor for every part of the merge.

Search by ``key`` is ``JobFilter.key``, which every broker answers exactly
over all its stored jobs (not over the newest few), so a key search is a
listing like any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ..brokers.base import Broker
from ..brokers.types import JobFilter, JobInfo
from ..state import State

#: the states of a queue's "all" tab, in the order the tabs show them
STATES = (
    State.READY,
    State.SCHEDULED,
    State.RETRYING,
    State.RUNNING,
    State.DEAD,
    State.SUCCEEDED,
    State.CANCELLED,
)


@dataclass(slots=True)
class Listing:
    items: list[JobInfo]
    cursor: str | None


async def merged(
    broker: Broker, filters: Sequence[JobFilter], cursor: str | None, limit: int
) -> Listing:
    """Newest first over the union of ``filters`` (disjoint selections)."""
    if len(filters) == 1:
        page = await broker.list_jobs(filters[0], cursor, limit)
        return Listing(page.items, page.cursor)
    pages = await asyncio.gather(*(broker.list_jobs(f, cursor, limit) for f in filters))
    items = sorted((i for p in pages for i in p.items), key=lambda i: i.message.id, reverse=True)
    more = len(items) > limit or any(p.cursor is not None for p in pages)
    items = items[:limit]
    return Listing(items, items[-1].message.id if items and more else None)


def split(
    base: JobFilter, queues: Sequence[str] | None, states: Sequence[State] | None
) -> list[JobFilter]:
    """``base`` for each queue x state given (None: leave that field as it is)."""
    qs: Sequence[str | None] = queues if queues else [base.queue]
    ss: Sequence[State | None] = states if states else [base.state]
    return [dataclasses.replace(base, queue=q, state=s) for q in qs for s in ss]
