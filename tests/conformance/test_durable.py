"""Durable workflows on every broker: checkpoints, sleeps, events, children,
versioning, compensation, retry, cancel and signals (docs/durable-workflows.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.durable import WorkflowStateError
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.conformance.helpers import eventually

FAST = dw.Retry(attempts=3, backoff=0.05, jitter=0)


class Activated(dw.Event, type="durable_test.user_activated", version=1):
    user_id: int
    plan: str = "free"


@pytest.fixture
def app(make_app: Callable[..., dw.App]) -> dw.App:
    return make_app(retry=FAST)


@contextlib.asynccontextmanager
async def _worker(app: dw.App, concurrency: int = 8) -> AsyncIterator[dw.Worker]:
    """A worker that runs until the block ends (runs that wait for an event
    have no job, so ``drain`` would stop under them)."""
    worker = dw.Worker(app, dw.WorkerConfig(concurrency=concurrency, fetch_wait=0.1))
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await task


async def _status(run: dw.WorkflowRun[Any], want: str, timeout: float = 20.0) -> None:
    await eventually(run.astatus, lambda s: s == want, timeout)


async def test_steps_run_once_and_replays_return_their_checkpoints(app: dw.App) -> None:
    calls: Counter[str] = Counter()

    def charge(order: str, cents: int) -> dict[str, Any]:
        calls["charge"] += 1
        return {"id": f"ch-{order}", "cents": cents}

    async def ship(order: str) -> str:
        calls["ship"] += 1
        return f"shipped {order}"

    @app.workflow
    def order(ctx: dw.WorkflowContext, order_id: str, cents: int) -> dict[str, Any]:
        calls["replays"] += 1
        charged = ctx.step("charge", charge, order_id, cents)
        ctx.sleep("settle", 0.05)  # ends the segment: the next one replays from the start
        shipped = ctx.step("ship", ship, order_id)
        stamp = ctx.uuid()
        return {"charge": charged, "ship": shipped, "stamp": stamp}

    @app.workflow
    async def aorder(ctx: dw.AsyncWorkflowContext, order_id: str) -> list[Any]:
        calls["areplays"] += 1
        first = await ctx.step("charge", charge, order_id, 5)
        await ctx.sleep("settle", 0.05)
        return [first, await ctx.step("ship", ship, order_id)]

    run = await order.aenqueue("o-1", 1200)
    arun = await aorder.aenqueue("o-2")
    await drain(app)
    result = await run.aresult(timeout=5)
    assert result["charge"] == {"id": "ch-o-1", "cents": 1200}
    assert result["ship"] == "shipped o-1"
    assert await arun.aresult(timeout=5) == [{"id": "ch-o-2", "cents": 5}, "shipped o-2"]
    assert calls["charge"] == 2 and calls["ship"] == 2  # once per run, however many replays
    assert calls["replays"] >= 2 and calls["areplays"] >= 2  # the sleep made them replay
    assert await run.astatus() == "succeeded"
    steps = (await run.ainfo())["steps"]
    assert [(s["name"], s["kind"], s["status"]) for s in steps] == [
        ("charge", "step", "done"),
        ("settle", "sleep", "done"),
        ("ship", "step", "done"),
        ("uuid", "uuid", "done"),
    ]
    assert steps[3]["output"] == result["stamp"]  # uuid() replays its first value
    assert (await app.broker.stats()) and all(s.dead == 0 for s in await app.broker.stats())


#: how far ahead of ``now()`` the replay test sleeps until: past by the time
#: ``sleep_until`` is reached (a loaded machine, a slow checkpoint write),
#: the sleep ends no segment and nothing replays
SLEEP_AHEAD = timedelta(seconds=0.5)


async def test_now_and_uuid_replay_their_first_values_across_a_sleep_until(
    app: dw.App,
) -> None:
    """``now()`` and ``uuid()`` taken before a ``sleep_until`` (which ends the
    segment, so the next one replays the function from the start) give the
    replay the values the first execution saw, sync and async alike."""
    seen: dict[str, list[tuple[datetime, str]]] = {"sync": [], "async": []}

    @app.workflow
    def stamped(ctx: dw.WorkflowContext) -> list[str]:
        now, uid = ctx.now(), ctx.uuid()
        seen["sync"].append((now, uid))
        ctx.sleep_until("later", now + SLEEP_AHEAD)
        return [now.isoformat(), uid]

    @app.workflow
    async def astamped(ctx: dw.AsyncWorkflowContext) -> list[str]:
        now, uid = await ctx.now(), await ctx.uuid()
        seen["async"].append((now, uid))
        await ctx.sleep_until("later", (now + SLEEP_AHEAD).timestamp())
        return [now.isoformat(), uid]

    runs = {"sync": await stamped.aenqueue(), "async": await astamped.aenqueue()}
    await drain(app)
    for kind, run in runs.items():
        first, *replays = seen[kind]
        assert replays, f"{kind}: the sleep should have made the run replay"
        assert all(r == first for r in replays), (kind, seen[kind])
        assert await run.aresult(timeout=5) == [first[0].isoformat(), first[1]]
        steps = (await run.ainfo())["steps"]
        assert [(s["kind"], s["status"]) for s in steps] == [
            ("now", "done"),
            ("uuid", "done"),
            ("sleep", "done"),
        ]


async def test_a_sleep_holds_no_worker(app: dw.App) -> None:
    @app.task(keep_result=True)
    def quick() -> str:
        return "done"

    @app.workflow
    async def napper(ctx: dw.AsyncWorkflowContext) -> str:
        await ctx.sleep("nap", 3600)
        return "awake"

    run = await napper.aenqueue()
    async with _worker(app, concurrency=1):
        await _status(run, "sleeping")
        job = await quick.aenqueue()  # runs only if the one slot is free
        assert await job.aresult(timeout=20) == "done"
        assert await run.astatus() == "sleeping"
        [due] = (await app.broker.list_jobs(JobFilter(state=State.SCHEDULED))).items
        assert due.message.name == napper.task.name  # the wake-up: a job due in an hour
        assert due.run_at is not None and due.run_at > due.message.created_at + 3000
        assert await run.acancel() is True


async def test_wait_for_event_resumes_on_a_matching_event(app: dw.App) -> None:
    @app.workflow
    async def onboarding(ctx: dw.AsyncWorkflowContext, user_id: int) -> str:
        event = await ctx.wait_for_event("activated", Activated, match={"user_id": user_id})
        assert event is not None
        return f"{event.user_id} on {event.plan}"

    run = await onboarding.aenqueue(7)
    other = await onboarding.aenqueue(8)
    async with _worker(app):
        await _status(run, "waiting")
        await _status(other, "waiting")
        await app.apublish(Activated(user_id=99, plan="pro"))  # nobody waits for it
        await app.apublish(Activated(user_id=7, plan="pro"))
        assert await run.aresult(timeout=20) == "7 on pro"
        assert await other.astatus() == "waiting"  # another user's wait is untouched
        await other.asignal({"user_id": 8, "plan": "team"})  # `dumbwaiter workflows signal`
        assert await other.aresult(timeout=20) == "8 on team"
    with pytest.raises(WorkflowStateError):
        await run.asignal({"user_id": 7})  # it waits for nothing any more


async def test_wait_for_event_times_out(app: dw.App) -> None:
    @app.workflow
    def nudge(ctx: dw.WorkflowContext, user_id: int) -> str:
        event = ctx.wait_for_event("activated", Activated, match={"user_id": user_id}, timeout=0.3)
        return "activated" if event is not None else "nudged"

    run = await nudge.aenqueue(3)
    await drain(app)
    assert await run.aresult(timeout=10) == "nudged"
    await app.apublish(Activated(user_id=3))  # too late: changes nothing
    await drain(app)
    assert await run.aresult(timeout=1) == "nudged"


async def test_child_workflows_return_their_result_or_fail_the_step(app: dw.App) -> None:
    @app.workflow
    def child(ctx: dw.WorkflowContext, n: int) -> int:
        if n < 0:
            ctx.step("explode", _explode, retry=False)
        return ctx.step("double", lambda: n * 2)

    @app.workflow
    async def parent(ctx: dw.AsyncWorkflowContext, n: int) -> Any:
        a = await ctx.child("first", child, n)
        try:
            await ctx.child("broken", child, -1)
        except dw.StepFailed as exc:
            return [a, exc.step, exc.type]
        return [a]

    run = await parent.aenqueue(21)
    await drain(app)
    assert await run.aresult(timeout=10) == [42, "broken", "ValueError"]
    info = await run.ainfo()
    kids = [s for s in info["steps"] if s["kind"] == "child"]
    assert [k["status"] for k in kids] == ["done", "failed"]
    assert await dw.WorkflowRun(app, kids[0]["child"]).aresult(timeout=1) == 42


def _explode() -> None:
    raise ValueError("no negatives")


async def test_changed_step_order_fails_the_run_with_a_clear_error(app: dw.App) -> None:
    deployed = {"v2": False}

    @app.workflow
    def signup(ctx: dw.WorkflowContext, user: int) -> str:
        ctx.step("create", lambda: user)
        if deployed["v2"]:  # a deploy put a new step where runs recorded the wait
            ctx.step("verify", lambda: True)
        ctx.wait_for_event("go", Activated, match={"user_id": user})
        ctx.step("mail", lambda: "sent")
        return "ok"

    run = await signup.aenqueue(11)
    async with _worker(app):
        await _status(run, "waiting")  # parked: "create" and the wait are recorded
        deployed["v2"] = True
        await app.apublish(Activated(user_id=11))
        with pytest.raises(dw.WorkflowFailed, match="workflow code changed at step 'verify'"):
            await run.aresult(timeout=20)
    err = (await run.ainfo())["error"]
    assert err["type"] == "dumbwaiter.durable.errors.WorkflowCodeChanged"
    [dead] = (await app.broker.list_jobs(JobFilter(state=State.DEAD))).items
    assert "workflow code changed" in dead.message.errors[-1].message  # in the DLQ, with why

    deployed["v2"] = False  # rolled back: retry resumes where it stopped
    await run.aretry()
    await drain(app)
    assert await run.aresult(timeout=10) == "ok"
    names = [s["name"] for s in (await run.ainfo())["steps"]]
    assert names == ["create", "go", "mail"]


async def test_versions_and_patches_keep_old_runs_on_their_path(app: dw.App) -> None:
    deployed = {"v2": False}

    @app.workflow
    def flow(ctx: dw.WorkflowContext, user: int) -> list[str]:
        path = [ctx.step("a", lambda: "a")]
        if deployed["v2"] and ctx.patched("add-b"):  # the change, guarded
            path.append(ctx.step("b", lambda: "b"))
        ctx.wait_for_event("go", Activated, match={"user_id": user})
        if deployed["v2"]:  # after the point runs in flight reached: needs no guard
            path.append(ctx.step("c", lambda: "c"))
        return path

    @app.workflow(version=3)
    def versioned(ctx: dw.WorkflowContext) -> int:
        return ctx.version

    old = await flow.aenqueue(21)
    async with _worker(app):
        await _status(old, "waiting")  # past the patch point on the old code
        deployed["v2"] = True
        new = await flow.aenqueue(22)
        await _status(new, "waiting")
        await app.apublish(Activated(user_id=21))
        await app.apublish(Activated(user_id=22))
        assert await new.aresult(timeout=20) == ["a", "b", "c"]  # the new path
        assert await old.aresult(timeout=20) == ["a", "c"]  # replays as it ran, then goes on
        v = await versioned.aenqueue()
        assert await v.aresult(timeout=20) == 3
    assert (await v.ainfo())["version"] == 3


async def test_a_failed_step_compensates_completed_steps_in_reverse_order(app: dw.App) -> None:
    undone: list[str] = []

    def undo(label: str) -> Callable[[Any], None]:
        def compensate(result: Any) -> None:
            undone.append(f"{label}:{result}")

        return compensate

    def ship() -> None:
        raise ConnectionError("carrier down")

    @app.workflow
    def order(ctx: dw.WorkflowContext) -> str:
        ctx.step("charge", lambda: "ch-1", compensate=undo("refund"))
        ctx.step("log", lambda: "no undo")
        ctx.step("reserve", lambda: "r-9", compensate=undo("release"))
        ctx.step("ship", ship, retry=dw.Retry(attempts=2, backoff=0.05, jitter=0))
        return "shipped"

    run = await order.aenqueue()
    await drain(app)
    with pytest.raises(dw.WorkflowFailed, match=r"step 'ship'.*carrier down"):
        await run.aresult(timeout=5)
    assert undone == ["release:r-9", "refund:ch-1"]  # last completed first, once each
    info = await run.ainfo()
    assert info["compensated"] is True
    assert [s["name"] for s in info["steps"] if s["kind"] == "compensate"] == [
        "reserve:compensate",
        "charge:compensate",
    ]
    with pytest.raises(WorkflowStateError, match="compensations ran"):
        await run.aretry()  # its effects were undone: not resumable


async def test_step_retries_keep_one_idempotency_key_and_hold_no_worker(app: dw.App) -> None:
    keys: list[str] = []

    @app.workflow
    def flaky(ctx: dw.WorkflowContext) -> int:
        def call() -> int:
            keys.append(ctx.step_key)
            if len(keys) < 3:
                raise TimeoutError("provider slow")
            return len(keys)

        return ctx.step("call", call, retry=dw.Retry(attempts=5, backoff=0.05, jitter=0))

    run = await flaky.aenqueue()
    await drain(app)
    assert await run.aresult(timeout=5) == 3
    assert keys == [f"{run.id}:call"] * 3
    [step] = (await run.ainfo())["steps"]
    assert step["attempts"] == 3


async def test_step_timeout_fails_an_attempt(app: dw.App) -> None:
    @app.workflow
    async def slow(ctx: dw.AsyncWorkflowContext) -> str:
        try:
            await ctx.step("wait", asyncio.sleep, 5, timeout=0.1, retry=False)
        except dw.StepFailed as exc:
            return exc.type
        return "finished"

    run = await slow.aenqueue()
    await drain(app)
    assert await run.aresult(timeout=5) == "dumbwaiter.durable.errors.StepTimeout"


async def test_retry_resumes_a_failed_run_from_the_failed_step(app: dw.App) -> None:
    calls: Counter[str] = Counter()
    broken = {"on": True}

    def reserve() -> str:
        calls["reserve"] += 1
        if broken["on"]:
            raise ConnectionError("warehouse down")
        return "r-1"

    @app.workflow
    def order(ctx: dw.WorkflowContext) -> list[str]:
        charged = ctx.step("charge", lambda: calls.update(["charge"]) or "ch-1")
        return [charged, ctx.step("reserve", reserve, retry=False)]

    run = await order.aenqueue()
    await drain(app)
    assert await run.astatus() == "failed"
    broken["on"] = False
    # replaying the dead letter is the same as `dumbwaiter workflows retry`
    assert await app.broker.replay(JobFilter(state=State.DEAD)) == 1
    await drain(app)
    assert await run.aresult(timeout=5) == ["ch-1", "r-1"]
    assert calls == {"charge": 1, "reserve": 2}  # resumed, not restarted


async def test_cancel_stops_a_run_before_its_next_step(app: dw.App) -> None:
    calls: list[str] = []

    @app.workflow
    def flow(ctx: dw.WorkflowContext) -> str:
        calls.append(ctx.step("before", lambda: "x"))
        ctx.wait_for_event("go", Activated, match={"user_id": 1})
        calls.append(ctx.step("after", lambda: "y"))
        return "done"

    run = await flow.aenqueue()
    later = await flow.options(delay=60).aenqueue()
    assert await later.astatus() == "pending"
    async with _worker(app):
        await _status(run, "waiting")
        assert await run.acancel() is True
        assert await run.acancel() is False  # it ended already
        assert await later.acancel() is True  # before its first job ran
        await app.apublish(Activated(user_id=1))
        await drain(app)
    assert calls == ["x"]
    for r in (run, later):
        assert await r.astatus() == "cancelled"
        with pytest.raises(dw.WorkflowCancelled):
            await r.aresult(timeout=1)
    [job] = (await app.broker.list_jobs(JobFilter(state=State.CANCELLED))).items
    assert job.message.id == later.id


async def test_bad_arguments_fail_at_the_start_call(app: dw.App) -> None:
    @app.workflow
    def flow(ctx: dw.WorkflowContext, user_id: int) -> None:
        return None

    with pytest.raises(dw.InvalidArguments):
        await flow.aenqueue()  # type: ignore[call-arg]
    with pytest.raises(dw.SerializationError):
        await flow.aenqueue(object())  # type: ignore[arg-type]


async def test_a_keyed_start_is_idempotent(app: dw.App) -> None:
    @app.workflow
    def once(ctx: dw.WorkflowContext, user_id: int) -> int:
        return ctx.step("only", lambda: user_id)

    first = await once.options(key="user:5").aenqueue(5)
    second = await once.options(key="user:5").aenqueue(5)
    assert first.id == second.id
    await drain(app)
    assert await first.aresult(timeout=5) == 5
