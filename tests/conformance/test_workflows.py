"""Workflows on every broker: chain, group, chord, failures and replay."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.state import State
from dumbwaiter.testing import drain

FAST = dw.Retry(attempts=5, backoff=0.01, jitter=0)


@pytest.fixture
def app(make_app: Callable[..., dw.App]) -> dw.App:
    return make_app(retry=FAST)


async def test_chain_passes_each_result_to_the_next_step(app: dw.App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    @app.task
    async def mul(x: int, by: int) -> int:
        return x * by

    @app.task
    def constant() -> str:
        return "fixed"

    wf = await dw.chain(add.s(1, 2), add.s(10), mul.s(2)).aenqueue()
    other = await dw.chain(add.s(1, 1), constant.si()).aenqueue()
    await drain(app)
    assert await wf.aresult(timeout=5) == 26  # ((1 + 2) + 10) * 2
    assert await other.aresult(timeout=5) == "fixed"  # si(): the result is not passed
    steps = await wf.asteps()
    assert [s["state"] for s in steps] == ["succeeded"] * 3
    assert [s["task"] for s in steps] == [add.name, add.name, mul.name]


async def test_group_and_chord(app: dw.App) -> None:
    @app.task
    def square(x: int) -> int:
        return x * x

    @app.task
    def total(results: list[int], label: str) -> str:
        return f"{label}={sum(results)}"

    g = await dw.group(square.s(i) for i in range(5)).aenqueue()
    c = await dw.chord(dw.group(square.s(i) for i in range(4)), total.s("sum")).aenqueue()
    chained = await dw.chain(square.s(3), dw.group(square.s(), square.s()), total.s("x")).aenqueue()
    await drain(app)
    assert await g.aresult(timeout=5) == [0, 1, 4, 9, 16]
    assert await c.aresult(timeout=5) == "sum=14"  # 0 + 1 + 4 + 9
    assert await chained.aresult(timeout=5) == "x=162"  # 81 + 81: each member got 9


async def test_a_failed_step_stops_the_chain_and_replay_resumes_it(app: dw.App) -> None:
    broken = {"on": True}
    ran: list[str] = []

    @app.task(retry=dw.Retry.never())
    def charge(order: str) -> str:
        ran.append("charge")
        if broken["on"]:
            raise ConnectionError("payment provider down")
        return order

    @app.task
    def ship(order: str) -> str:
        ran.append("ship")
        return f"shipped {order}"

    @app.task
    def validate(order: str) -> str:
        ran.append("validate")
        return order

    wf = await dw.chain(validate.s("o-1"), charge.s(), ship.s()).aenqueue()
    await drain(app)
    assert ran == ["validate", "charge"]  # stopped at the failure
    [dead] = (await app.broker.list_jobs(JobFilter(state=State.DEAD))).items
    assert dead.message.headers["wf"]["id"] == wf.id  # dead-lettered with its workflow
    assert [s["state"] for s in await wf.asteps()] == ["succeeded", "dead", "pending"]

    broken["on"] = False
    await app.broker.replay(JobFilter(state=State.DEAD))
    await drain(app)
    assert ran == ["validate", "charge", "charge", "ship"]  # resumed, not restarted
    assert await wf.aresult(timeout=5) == "shipped o-1"


async def test_chord_callback_runs_once_under_concurrency_and_retries(app: dw.App) -> None:
    calls: dict[str, int] = {}
    rng = random.Random(7)

    @app.task
    async def part(n: int, ctx: dw.Context) -> int:
        if ctx.attempt == 1 and rng.random() < 0.3:
            raise TimeoutError("flaky member")
        await asyncio.sleep(0)
        return n

    @app.task
    def collect(results: list[int], tag: str) -> int:
        calls[tag] = calls.get(tag, 0) + 1
        return sum(results)

    flows = [
        await dw.chord(dw.group(part.s(i) for i in range(12)), collect.s(f"c{k}")).aenqueue()
        for k in range(8)
    ]
    workers = [dw.Worker(app, concurrency=6, fetch_wait=0.05) for _ in range(3)]
    runs = [asyncio.create_task(w.run()) for w in workers]
    results = [await f.aresult(timeout=60) for f in flows]
    for w in workers:
        w.stop()
    await asyncio.gather(*runs)
    assert results == [sum(range(12))] * 8
    assert calls == {f"c{k}": 1 for k in range(8)}  # each callback exactly once


async def test_signatures_check_their_arguments(app: dw.App) -> None:
    @app.task
    def f(x: Any) -> None: ...

    with pytest.raises(dw.SerializationError):
        f.s(object())
    with pytest.raises(dw.ConfigurationError):
        dw.group()


async def test_a_dead_step_fails_the_workflow_naming_it(app: dw.App) -> None:
    """``result()`` of a workflow whose step is dead raises ``WorkflowFailed``
    (a ``JobFailed``) naming the step, its task, its error and the dead job,
    at once rather than at the timeout; ``status()`` says ``dead``.  Chain,
    group and chord alike; a replayed step makes the workflow alive again."""

    @app.task(retry=dw.Retry.never())
    def charge(order: str) -> str:
        if order.startswith("bad"):
            raise ConnectionError(f"payment provider down for {order}")
        return order

    @app.task
    def ship(order: str) -> str:
        return f"shipped {order}"

    @app.task(retry=dw.Retry.never())
    def summarize(orders: list[str]) -> str:
        raise ValueError(f"cannot sum {len(orders)} orders")

    chained = await dw.chain(ship.s("o-1"), charge.s(), ship.s()).aenqueue()  # "shipped o-1" ok
    failing = await dw.chain(charge.s("o-2"), charge.si("bad-2"), ship.s()).aenqueue()
    grouped = await dw.group(charge.s("o-3"), charge.s("bad-3")).aenqueue()
    chorded = await dw.chord([charge.s("o-4"), charge.s("o-5")], summarize.s()).aenqueue()
    await drain(app)
    with pytest.raises(dw.JobFailed) as raised:  # not ResultTimeout
        await failing.aresult(timeout=30)
    e = raised.value
    assert isinstance(e, dw.WorkflowFailed)
    [dead] = [s for s in await failing.asteps() if s["state"] == "dead"]
    assert (e.workflow_id, e.step, e.task, e.job_id) == (failing.id, "1", charge.name, dead["job"])
    assert (e.error_type, e.error) == ("ConnectionError", "payment provider down for bad-2")
    for part in ("step 1", charge.name, dead["job"], "ConnectionError: payment provider down"):
        assert part in str(e)
    assert await failing.astatus() == State.DEAD
    assert await chained.aresult(timeout=5) == "shipped shipped o-1"
    assert await chained.astatus() == State.SUCCEEDED

    with pytest.raises(dw.WorkflowFailed) as failed:
        await grouped.aresult(timeout=30)
    assert (failed.value.step, failed.value.error) == ("0.1", "payment provider down for bad-3")
    assert await grouped.astatus() == State.DEAD

    with pytest.raises(dw.WorkflowFailed) as failed:
        await chorded.aresult(timeout=30)
    assert (failed.value.step, failed.value.task) == ("0.then", summarize.name)
    assert failed.value.error == "cannot sum 2 orders"
    assert await chorded.astatus() == State.DEAD

    # replayed, the step is alive again: the workflow is not failed any more
    await app.broker.replay(JobFilter(state=State.DEAD, name=summarize.name))
    assert await chorded.astatus() in (State.READY, State.RUNNING)
    with pytest.raises(dw.ResultTimeout):
        await chorded.aresult(timeout=0.05)
