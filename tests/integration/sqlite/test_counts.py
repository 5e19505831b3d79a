"""``dw_counts`` stays exact: the counters per queue and state that ``stats``
and a bounded queue's ``max_ready`` read.

Inserts, claims (ready -> running) and acks (running -> succeeded) are
counted by the broker per batch; every other change and every delete by a
trigger (schema.sql).  After a workload that makes every transition through
the broker's API, the counters must equal a count of the rows."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dumbwaiter.brokers.capacity import waiting
from dumbwaiter.brokers.sqlite.broker import SQLiteBroker
from dumbwaiter.brokers.types import Delivery, JobFilter
from dumbwaiter.errors import QueueFull
from dumbwaiter.message import TASK, ErrorRecord, Message, uuid7
from dumbwaiter.state import State


def _msg(queue: str = "a", **kw: Any) -> Message:
    kw.setdefault("max_attempts", 4)
    return Message(
        id=uuid7(), kind=TASK, name="t.job", queue=queue, args=[], created_at=time.time(), **kw
    )


def _counts(path: Path) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """(the counters, the rows counted), zeros left out."""
    c = sqlite3.connect(path)
    try:
        kept = {(q, s): n for q, s, n in c.execute("SELECT queue, state, n FROM dw_counts") if n}
        rows = {
            (q, s): n
            for q, s, n in c.execute(
                "SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying'"
                " ELSE state END AS st, count(*) FROM dw_jobs GROUP BY queue, st"
            )
        }
    finally:
        c.close()
    return kept, rows


def _due(path: Path, queue: str) -> int:
    """The queue's jobs that a claim would take now (ready, or scheduled and due)."""
    c = sqlite3.connect(path)
    try:
        row = c.execute(
            "SELECT count(*) FROM dw_jobs WHERE queue=? AND state IN ('ready', 'scheduled')"
            " AND run_at<=?",
            (queue, time.time()),
        ).fetchone()
    finally:
        c.close()
    return int(row[0])


def _assert_exact(path: Path) -> dict[tuple[str, str], int]:
    kept, rows = _counts(path)
    assert kept == rows
    return rows


def _failed(d: Delivery, retry_at: float = 0.0) -> Delivery:
    d.error = ErrorRecord(time=time.time(), type="ValueError", message="no", attempt=1)
    d.retry_at = retry_at
    return d


async def _fetch(
    b: SQLiteBroker, n: int, queues: tuple[str, ...] = ("a", "b"), **kw: Any
) -> list[Delivery]:
    got = await b.fetch(list(queues), n, lease=kw.pop("lease", 30.0), wait=kw.pop("wait", 0.0))
    assert len(got) == n
    return got


async def test_counters_equal_the_rows_after_every_kind_of_change(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    b = SQLiteBroker(f"sqlite:///{path}")
    await b.open()
    try:
        soon = time.time() + 0.3
        await b.enqueue([_msg() for _ in range(20)] + [_msg("b") for _ in range(10)])
        due_soon = [_msg(eta=soon) for _ in range(3)]
        await b.enqueue([*due_soon, _msg("b", eta=time.time() + 3600)])
        await b.enqueue([_msg(key="k1"), _msg(key="k1"), _msg("b", key="k2")])  # one duplicate
        _assert_exact(path)

        # claims over two queues, then every outcome of a running job
        got = await _fetch(b, 16)
        assert {d.queue for d in got} == {"a"}  # queue a first, in the order asked
        got += await _fetch(b, 4, ("b",))
        acked, rest = got[:4] + got[-2:], got[4:-2]  # an ack over both queues
        lost = replace(rest[0], token=12345)  # another holder's token: finishes nothing
        await b.ack([*acked, acked[0], lost])  # the same job twice: counted once
        _assert_exact(path)
        await b.retry([_failed(rest[1]), _failed(rest[2], retry_at=time.time() + 3600)])
        await b.dead([_failed(rest[3]), _failed(rest[4])])
        await b.requeue([rest[5], rest[6]])
        await b.ack(acked[:1])  # already succeeded: nothing
        rows = _assert_exact(path)
        assert rows[("a", "succeeded")] == 4 and rows[("b", "succeeded")] == 2
        assert rows[("a", "retrying")] == 1 and rows[("a", "dead")] == 2

        # a lease that ran out: one job back to ready, one buried (its last attempt)
        await b.enqueue([_msg("c"), _msg("c", max_attempts=1)])
        await _fetch(b, 2, ("c",), lease=-1.0)
        rescued = await b.rescue()
        assert rescued == 2 and len(rescued.dead) == 1
        _assert_exact(path)

        # admin: cancel (ready and scheduled), replay, purge, reschedule
        ready = (await b.list_jobs(JobFilter(queue="b", state=State.READY))).items
        far = (await b.list_jobs(JobFilter(queue="b", state=State.SCHEDULED))).items
        assert len(await b.cancel([ready[0].message.id, far[0].message.id])) == 2
        assert await b.replay(JobFilter(state=State.DEAD, queue="a")) == 2
        assert await b.purge(JobFilter(state=State.SUCCEEDED, queue="b")) == 2
        assert await b.purge(JobFilter(state=State.CANCELLED)) == 2
        later = (await b.list_jobs(JobFilter(queue="a", state=State.READY))).items[:2]
        assert len(await b.reschedule([j.message.id for j in later], time.time() + 3600)) == 2
        _assert_exact(path)

        # a unique key whose holder succeeded: the new job takes it over
        holder = (await b.list_jobs(JobFilter(key="k1"))).items
        assert len(holder) == 1
        await b.enqueue([_msg("k", key="k3")])
        [k3] = await _fetch(b, 1, ("k",))
        await b.ack([k3])
        await b.enqueue([_msg("k", key="k3", headers={"unique": "active"})])
        _assert_exact(path)

        # the due scheduled jobs become ready at the claim: drain queue a
        await b.ack([rest[0], *rest[7:]])  # the jobs still running since the first claim
        for _ in range(50):
            got = await b.fetch(["a"], 100, lease=30.0, wait=1.0)
            await b.ack(got)
            if not got and not _due(path, "a"):
                break
        assert not _due(path, "a")
        for m in due_soon:  # promoted by a claim, claimed and acked
            info = await b.get(m.id)
            assert info is not None and info.state is State.SUCCEEDED
        rows = _assert_exact(path)
        assert ("a", "ready") not in rows and ("a", "running") not in rows
        stats = {s.queue: s for s in await b.stats()}
        assert stats["a"].succeeded == rows[("a", "succeeded")]
    finally:
        await b.close()


async def test_a_bounded_queue_holds_its_bound_through_claims_and_acks(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    b = SQLiteBroker(f"sqlite:///{path}")
    await b.open()
    bound = {"bq": 3}
    try:
        await b.enqueue_bounded([_msg("bq") for _ in range(3)], bound)
        with pytest.raises(QueueFull):
            await b.enqueue_bounded([_msg("bq")], bound)
        got = await _fetch(b, 2, ("bq",))
        await b.ack(got[:1])
        await b.enqueue_bounded([_msg("bq"), _msg("bq")], bound)  # two made room
        with pytest.raises(QueueFull) as full:
            await b.enqueue_bounded([_msg("bq")], bound)
        assert full.value.waiting == 3
        await b.ack(got[1:])  # a running job's ack makes no room
        with pytest.raises(QueueFull):
            await b.enqueue_bounded([_msg("bq")], bound)
        assert sum(waiting(s) for s in await b.stats() if s.queue == "bq") == 3
        _assert_exact(path)
    finally:
        await b.close()


_OLD_UPDATE_TRIGGER = """
CREATE TRIGGER dw_jobs_count_update AFTER UPDATE OF state, attempt, queue ON dw_jobs
WHEN OLD.queue != NEW.queue OR OLD.state != NEW.state
     OR (NEW.state = 'scheduled' AND (OLD.attempt > 0) != (NEW.attempt > 0)) BEGIN
    UPDATE dw_counts SET n = n - 1
    WHERE queue = OLD.queue AND state = CASE WHEN OLD.state = 'scheduled' AND OLD.attempt > 0
                                             THEN 'retrying' ELSE OLD.state END;
    INSERT INTO dw_counts (queue, state, n)
    VALUES (NEW.queue, CASE WHEN NEW.state = 'scheduled' AND NEW.attempt > 0
                            THEN 'retrying' ELSE NEW.state END, 1)
    ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END
"""


async def test_a_file_with_the_trigger_that_counted_every_change_loses_it_on_open(
    tmp_path: Path,
) -> None:
    """A file made before claims and acks were counted by the broker has the
    trigger that counted them too; opening it drops that trigger, or each
    claim and ack would count twice."""
    path = tmp_path / "q.db"
    c = sqlite3.connect(path, isolation_level=None)
    b = SQLiteBroker(f"sqlite:///{path}")
    await b.open()
    await b.enqueue([_msg() for _ in range(4)])
    await b.close()
    c.execute("DROP TRIGGER dw_jobs_count_change")
    c.execute(_OLD_UPDATE_TRIGGER)
    c.close()
    b = SQLiteBroker(f"sqlite:///{path}")
    await b.open()
    try:
        got = await _fetch(b, 3, ("a",))
        await b.ack(got[:2])
        await b.retry([_failed(got[2])])
        assert _assert_exact(path) == {("a", "succeeded"): 2, ("a", "ready"): 2}
    finally:
        await b.close()
