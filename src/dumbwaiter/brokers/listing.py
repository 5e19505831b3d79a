"""``list_jobs``'s page, for the engines that list jobs they read whole
(memory, NATS, and the record engines: RabbitMQ, Kafka): the SQL engines
and Redis page in the server."""

from __future__ import annotations

from collections.abc import Iterable

from .types import JobInfo, Page


def jobs_page(infos: Iterable[JobInfo], cursor: str | None, limit: int) -> Page:
    """The jobs after ``cursor``, newest first (by id: UUIDv7 ids are
    time-ordered), ``limit`` of them, and the next page's cursor (None: the
    last page)."""
    found = sorted(
        (i for i in infos if cursor is None or i.message.id < cursor),
        key=lambda i: i.message.id,
        reverse=True,
    )
    page = found[:limit]
    return Page(items=page, cursor=page[-1].message.id if len(found) > limit and page else None)
