"""What a succeeded job keeps (brokers/finished.py): a task without
``keep_result`` still reports ``succeeded`` for the retention, is still
listed, and its id still de-duplicates an enqueue sent again; a task with
``keep_result`` keeps its result and its whole record."""

from __future__ import annotations

import time

import pytest

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Delivery, JobFilter
from dumbwaiter.message import dumps
from dumbwaiter.state import State

from .conftest import msg
from .helpers import error, fetch_all

ARG = "x" * 500


async def _succeed(
    broker: Broker, d: Delivery, value: object = None, keep: float | None = None
) -> None:
    started = time.time()
    d.started_at = started
    record = {"started": started, "finished": time.time()}
    if keep is not None:
        record["value"] = value  # type: ignore[assignment]
    d.result, d.result_ttl = dumps(record), keep
    await broker.ack([d])


async def test_a_succeeded_task_keeps_its_state_and_a_compact_record(broker: Broker) -> None:
    m = msg("t.compact", args=[ARG], headers={"trace": "abc"})
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error, d.retry_at = error(), 0.0
    await broker.retry([d])  # an error history, which success drops
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await _succeed(broker, d)

    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED
    assert (info.message.id, info.message.name, info.message.queue) == (
        m.id,
        "t.compact",
        "default",
    )
    assert info.updated_at is not None
    done = info.outcome()
    assert "value" not in done and isinstance(done.get("finished"), float)
    assert info.to_dict()["state"] == "succeeded"
    # every engine keeps only a compact record of it
    assert info.compact
    assert (info.message.args, info.message.kwargs, info.message.headers) == ([], {}, {})
    assert info.message.errors == []
    assert info.raw is None
    assert info.message.attempt == 2, "the attempt that succeeded (after a retry)"

    # sent again (a relay that lost the reply): stored once, not run again
    await broker.enqueue([m])
    assert await broker.fetch(["default"], 1, 30.0, 0) == []
    again = await broker.get(m.id)
    assert again is not None and again.state is State.SUCCEEDED

    [stats] = await broker.stats()
    assert stats.succeeded == 1


async def test_a_kept_result_keeps_the_whole_record(broker: Broker) -> None:
    m = msg("t.kept", args=[ARG], headers={"trace": "abc"})
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await _succeed(broker, d, value={"answer": 42}, keep=60.0)
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and not info.compact
    assert info.outcome()["value"] == {"answer": 42}
    assert info.message.args == [ARG] and info.message.headers == {"trace": "abc"}


@pytest.mark.parametrize("state", [None, State.SUCCEEDED])
async def test_succeeded_jobs_are_listed_newest_first_whatever_they_keep(
    broker: Broker, state: State | None
) -> None:
    """The listing (``jobs ls``, the dashboard) pages through compact and
    whole records together, by ``id < cursor`` as always."""
    ms = [msg("t.list", args=[ARG]) for _ in range(7)]
    await broker.enqueue(ms)
    ds = {d.id: d for d in await fetch_all(broker)}
    for i, m in enumerate(ms):
        await _succeed(broker, ds[m.id], value=i, keep=60.0 if i % 3 == 0 else None)
    other = msg("t.other", "other")
    await broker.enqueue([other])  # ready, in another queue

    seen: list[str] = []
    cursor = None
    while True:
        page = await broker.list_jobs(JobFilter(queue="default", state=state), cursor, 3)
        seen += [i.message.id for i in page.items]
        assert all(i.state is State.SUCCEEDED and i.message.name == "t.list" for i in page.items)
        for info in page.items:
            info.to_dict()  # what `jobs ls --json` prints
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == sorted((m.id for m in ms), reverse=True)

    every = await broker.list_jobs(JobFilter(), None, 50)
    assert {i.message.id for i in every.items} == {m.id for m in ms} | {other.id}
    named = await broker.list_jobs(JobFilter(name="t.list", state=State.SUCCEEDED), None, 50)
    assert len(named.items) == 7
    by_id = await broker.list_jobs(JobFilter(ids=(ms[1].id, ms[3].id)), None, 50)
    assert {i.message.id for i in by_id.items} == {ms[1].id, ms[3].id}
