"""Admin: cancel, stats, list, get, replay, purge, pause and resume."""

from __future__ import annotations

import time

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State

from .conftest import msg
from .helpers import error, fetch_all


async def _dead(
    broker: Broker, n: int, kind: str = "builtins.ValueError", **kw: object
) -> list[str]:
    ms = [msg(**kw) for _ in range(n)]  # type: ignore[arg-type]
    await broker.enqueue(ms)
    ids = {m.id for m in ms}
    ds = [d for d in await fetch_all(broker, queue=ms[0].queue) if d.id in ids]
    for d in ds:
        d.error = error(kind=kind)
    await broker.dead(ds)
    return [m.id for m in ms]


async def test_cancel_before_start_only(broker: Broker) -> None:
    waiting, later, running = msg(), msg(eta=time.time() + 3600), msg()
    await broker.enqueue([running])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.enqueue([waiting, later])
    cancelled = await broker.cancel([waiting.id, later.id, running.id, "no-such-id"])
    assert sorted(cancelled) == sorted([waiting.id, later.id])
    assert (await broker.get(waiting.id)).state is State.CANCELLED  # type: ignore[union-attr]
    assert (await broker.get(running.id)).state is State.RUNNING  # type: ignore[union-attr]
    assert await broker.fetch(["default"], 10, 30.0, 0) == []
    assert await broker.cancel([waiting.id]) == []  # already cancelled
    await broker.ack([d])


async def test_cancel_a_retrying_job(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error, d.retry_at = error(), time.time() + 3600
    await broker.retry([d])
    assert await broker.cancel([m.id]) == [m.id]


async def test_stats_counts_states_and_lag(broker: Broker) -> None:
    old = msg()
    await broker.enqueue([old])
    await broker.enqueue([msg(), msg(eta=time.time() + 3600), msg(queue="email")])
    [run] = await broker.fetch(["email"], 1, 30.0, 0)
    await _dead(broker, 2, queue="reports")
    before = time.time()
    stats = {s.queue: s for s in await broker.stats()}
    assert set(stats) >= {"default", "email", "reports"}
    d, e, r = stats["default"], stats["email"], stats["reports"]
    assert (d.ready, d.scheduled, d.running, d.dead) == (2, 1, 0, 0)
    assert (e.ready, e.running) == (0, 1)
    assert (r.dead, r.ready) == (2, 0)
    assert 0 < d.lag <= before - old.created_at + 5
    assert e.lag == 0.0
    await broker.ack([run])


async def test_get_unknown_is_none(broker: Broker) -> None:
    assert await broker.get("01890000-0000-7000-8000-000000000000") is None


async def test_list_filters_and_pages(broker: Broker) -> None:
    ms = [msg(name="a.task", args=[i]) for i in range(25)] + [msg(name="b.task") for _ in range(5)]
    for m in ms:
        await broker.enqueue([m])
    seen: list[str] = []
    cursor = None
    while True:
        page = await broker.list_jobs(JobFilter(name="a.task"), cursor, 10)
        seen += [i.message.id for i in page.items]
        assert all(i.state is State.READY for i in page.items)
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == sorted((m.id for m in ms[:25]), reverse=True)  # newest first, each once
    page = await broker.list_jobs(JobFilter(state=State.READY, queue="default"), None, 100)
    assert len(page.items) == 30 and page.cursor is None
    assert (await broker.list_jobs(JobFilter(state=State.DEAD))).items == []


async def test_replay_gives_fresh_attempts_and_keeps_history(broker: Broker) -> None:
    [jid] = await _dead(broker, 1)
    assert await broker.replay(JobFilter(state=State.DEAD)) == 1
    info = await broker.get(jid)
    assert info is not None and info.state is State.READY and info.replays == 1
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    assert d.id == jid
    assert d.message is not None and d.message.attempt == 1
    assert [e.type for e in d.message.errors] == ["builtins.ValueError"]


async def test_replay_by_filter_touches_only_dead_matches(broker: Broker) -> None:
    value_errs = await _dead(broker, 2, kind="builtins.ValueError")
    key_errs = await _dead(broker, 2, kind="myapp.errors.PaymentDeclined")
    other_queue = await _dead(broker, 1, queue="email")
    alive = msg()
    await broker.enqueue([alive])
    assert await broker.replay(JobFilter(error_type="PaymentDeclined")) == 2
    assert await broker.replay(JobFilter(error_type="ValueError", queue="email")) == 1
    assert await broker.replay(JobFilter(ids=(value_errs[0], alive.id))) == 1
    states = {i: (await broker.get(i)).state for i in value_errs + key_errs + other_queue}  # type: ignore[union-attr]
    assert states[value_errs[0]] is State.READY and states[value_errs[1]] is State.DEAD
    assert all(states[i] is State.READY for i in key_errs)
    assert states[other_queue[0]] is State.READY
    assert (await broker.get(alive.id)).replays == 0  # type: ignore[union-attr]


async def test_replay_by_time_range(broker: Broker) -> None:
    early = await _dead(broker, 1)
    cut = time.time()
    await _dead(broker, 1, name="late.task")
    assert await broker.replay(JobFilter(state=State.DEAD, until=cut)) == 1
    assert (await broker.get(early[0])).state is State.READY  # type: ignore[union-attr]


async def test_purge_deletes_matches_but_never_running_jobs(broker: Broker) -> None:
    dead = await _dead(broker, 3)
    running = msg()
    await broker.enqueue([running])
    await broker.fetch(["default"], 1, 30.0, 0)
    waiting = msg(queue="keep")
    await broker.enqueue([waiting])
    assert await broker.purge(JobFilter(ids=(dead[0],))) == 1
    assert await broker.get(dead[0]) is None
    assert await broker.purge(JobFilter(queue="default")) == 2  # the other dead ones
    assert (await broker.get(running.id)).state is State.RUNNING  # type: ignore[union-attr]
    assert (await broker.get(waiting.id)).state is State.READY  # type: ignore[union-attr]


async def test_pause_and_resume_a_queue(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    await broker.pause("default")
    assert await broker.fetch(["default"], 1, 30.0, 0) == []
    assert {s.queue: s.paused for s in await broker.stats()}["default"] is True
    await broker.enqueue([msg()])  # enqueue still works while paused
    await broker.resume("default")
    assert len(await fetch_all(broker)) == 2


async def test_builtin_error_types_match_with_or_without_module(broker: Broker) -> None:
    await _dead(broker, 1, kind="ValueError")  # how the worker records built-ins
    assert len((await broker.list_jobs(JobFilter(error_type="builtins.ValueError"))).items) == 1
    assert len((await broker.list_jobs(JobFilter(error_type="ValueError"))).items) == 1
    assert (await broker.list_jobs(JobFilter(error_type="KeyError"))).items == []


async def test_stats_agree_with_the_stored_jobs_after_every_kind_of_change(broker: Broker) -> None:
    """However stats are kept (counted, or counters), they match the jobs."""
    await broker.enqueue([msg(args=[i]) for i in range(12)] + [msg(eta=time.time() + 3600)])
    ds = await broker.fetch(["default"], 10, 30.0, 0)
    retry, dead, ack, back = ds[:2], ds[2:4], ds[4:7], ds[7:]
    for d in retry:
        d.error, d.retry_at = error(), time.time() + 3600
    for d in dead:
        d.error = error()
    await broker.retry(retry)
    await broker.dead(dead)
    await broker.ack(ack)
    await broker.requeue(back)
    waiting = (await broker.list_jobs(JobFilter(state=State.READY))).items
    await broker.cancel([waiting[0].message.id])
    await broker.replay(JobFilter(ids=(dead[0].id,)))
    await broker.purge(JobFilter(ids=(ack[0].id,)))
    [s] = await broker.stats()
    counts = {}
    for state in State:
        counts[state] = len((await broker.list_jobs(JobFilter(state=state), None, 100)).items)
    assert (s.ready, s.scheduled, s.retrying, s.running) == (
        counts[State.READY],
        counts[State.SCHEDULED],
        counts[State.RETRYING],
        counts[State.RUNNING],
    )
    assert (s.dead, s.succeeded, s.cancelled) == (
        counts[State.DEAD],
        counts[State.SUCCEEDED],
        counts[State.CANCELLED],
    )
    assert (s.ready, s.retrying, s.dead, s.succeeded, s.cancelled) == (5, 2, 1, 2, 1)
