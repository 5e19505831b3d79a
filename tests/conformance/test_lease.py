"""Leases: they expire and the job comes back; heartbeats keep them; fencing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import dumbwaiter as dw
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import DeadLetter
from dumbwaiter.message import ErrorRecord
from dumbwaiter.state import State
from dumbwaiter.testing import drain

from .conftest import msg
from .helpers import eventually


async def _rescued(broker: Broker) -> int:
    return await eventually(broker.rescue, lambda n: n > 0)


async def test_expired_lease_is_redelivered_with_an_error(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 0.2, 0, "w-dead")
    assert await broker.fetch(["default"], 1, 30.0, 0) == []  # held while the lease holds
    assert await _rescued(broker) == 1
    [again] = await broker.fetch(["default"], 1, 30.0, 0, "w-new")
    assert again.id == m.id
    assert again.message is not None and again.message.attempt == 2
    [err] = again.message.errors
    assert err.type.endswith("LeaseExpired") and err.worker == "w-dead" and err.attempt == 1
    # the first worker wakes up late: its ack must not count (fencing)
    await broker.ack([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-new"


async def test_extend_keeps_the_lease(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 0.3, 0)
    first = d.lease_until
    assert await broker.extend([d], 60.0) == []
    assert d.lease_until > first + 30
    info = await broker.get(m.id)
    assert info is not None and info.lease_until is not None and info.lease_until > first + 30
    await asyncio.sleep(max(0.0, first - time.time()) + 0.1)  # the old lease runs out
    assert await broker.rescue() == 0
    info = await broker.get(m.id)
    assert info is not None and info.state is State.RUNNING


async def test_extend_reports_lost_leases(broker: Broker) -> None:
    await broker.enqueue([msg(), msg()])
    ds = await broker.fetch(["default"], 2, 0.2, 0)
    kept = ds[0]
    assert await broker.extend([kept], 60.0) == []
    assert await _rescued(broker) == 1  # the other one expired
    lost = await broker.extend(ds, 60.0)
    assert [d.id for d in lost] == [ds[1].id]


async def test_job_that_keeps_losing_its_worker_goes_dead(broker: Broker) -> None:
    m = msg(max_attempts=2)
    await broker.enqueue([m])
    for _ in range(2):
        await broker.fetch(["default"], 1, 0.1, 0, "w-crashy")
        assert await _rescued(broker) == 1
    info = await broker.get(m.id)
    assert info is not None and info.state is State.DEAD
    assert [e.type.rsplit(".", 1)[-1] for e in info.message.errors] == ["LeaseExpired"] * 2
    assert await broker.fetch(["default"], 1, 30.0, 0) == []


async def test_rescue_reports_the_jobs_it_dead_letters(broker: Broker) -> None:
    """A job whose worker died holding its last attempt goes dead without any
    worker settling it: ``rescue`` reports it (the worker calls ``on_dead``
    for it) with its queue, task name and the ``LeaseExpired`` error, and
    reports nothing for a job it only gave back."""
    assert (await broker.rescue()).dead == ()
    doomed = msg(
        "t.doomed",
        queue="graveyard",
        max_attempts=1,
        args=[42, "x"],
        kwargs={"channel": "sms"},
        headers={"tenant": "acme"},
    )
    spared = msg("t.spared", queue="graveyard", max_attempts=2)
    await broker.enqueue([doomed, spared])
    ds = await broker.fetch(["graveyard"], 2, 0.2, 0, "w-gone")
    assert {d.id for d in ds} == {doomed.id, spared.id}
    handled = 0
    dead: list[DeadLetter] = []

    async def rescue() -> int:
        nonlocal handled
        r = await broker.rescue()
        handled += r
        dead.extend(r.dead)
        return handled

    await eventually(rescue, lambda n: n >= 2)
    assert [(d.id, d.queue, d.name) for d in dead] == [(doomed.id, "graveyard", "t.doomed")]
    err = dead[0].error
    assert err.type.endswith("LeaseExpired") and err.worker == "w-gone" and err.attempt == 1
    info = await broker.get(doomed.id)
    assert info is not None and info.state is State.DEAD
    assert info.message.errors[-1] == err  # the very record the job keeps
    # the report carries the stored envelope, as get() shows it
    m = dead[0].message
    assert m is not None
    assert (m.id, m.kind, m.name, m.queue) == (doomed.id, "task", "t.doomed", "graveyard")
    assert (m.args, m.kwargs, m.headers["tenant"]) == ([42, "x"], {"channel": "sms"}, "acme")
    assert (m.attempt, m.max_attempts, m.errors) == (1, 1, info.message.errors)
    back = await broker.get(spared.id)
    assert back is not None and back.state is State.READY
    assert (await broker.rescue()).dead == ()  # reported once


async def test_on_dead_of_a_job_the_rescuer_buries_sees_its_whole_message(
    make_app: Callable[..., dw.App],
) -> None:
    """A worker died holding a job's last attempt: the rescuing worker calls
    ``on_dead`` with the job's real message (task name, arguments, headers,
    every error), which alerting and logging hooks rely on, not a stub."""
    seen: list[tuple[dw.Context | None, ErrorRecord]] = []

    class Watch(dw.Middleware):
        def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            seen.append((ctx, error))

    app = make_app(middleware=[Watch()])

    @app.task(queue="graveyard", retry=False)
    def notify(user_id: int, *, channel: str) -> None:
        raise AssertionError("never runs: its only attempt was lost")

    job = await notify.options(headers={"tenant": "acme"}).aenqueue(42, channel="sms")
    # a worker took it and died: its lease runs out, nobody settles it
    [_] = await app.broker.fetch(["graveyard"], 1, 0.2, 0, "w-gone")
    await drain(app, ["graveyard"], rescue_interval=0.05)  # drained once it is buried
    [(ctx, err)] = seen
    assert ctx is not None
    m = ctx.message
    assert (m.id, m.kind, m.name, m.queue) == (job.id, "task", notify.name, "graveyard")
    assert (m.args, m.kwargs, m.headers.get("tenant")) == ([42], {"channel": "sms"}, "acme")
    assert (m.attempt, m.max_attempts) == (1, 1)
    assert err.type.endswith("LeaseExpired") and err.worker == "w-gone"
    assert m.errors == [err]
