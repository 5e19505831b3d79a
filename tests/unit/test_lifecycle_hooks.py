"""The awaited lifecycle hooks a user's middleware can use, as the app's own
workflows and batches do: ``after_success``, ``on_dead`` and
``on_cancelled``, each before the worker stores the outcome."""

from __future__ import annotations

import asyncio
import gc
import weakref

import dumbwaiter as dw
from dumbwaiter.brokers.types import Rescued
from dumbwaiter.cancel import request_cancel
from dumbwaiter.message import ErrorRecord
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from dumbwaiter.workflow import derived_id

FAST = dw.Retry(attempts=2, backoff=(0.01,), jitter=0)


async def _state(ctx: dw.Context) -> State | None:
    info = await ctx.app.broker.get(ctx.job_id)
    return None if info is None else info.state


async def test_after_success_is_awaited_with_the_result_before_the_ack() -> None:
    seen: list[tuple[object, State | None]] = []

    class Audit(dw.Middleware):
        async def after_success(self, ctx: dw.Context) -> None:
            seen.append((ctx.state["result"], await _state(ctx)))

    app = dw.App("memory://", middleware=[Audit()])

    @app.task
    async def double(n: int) -> int:
        return 2 * n

    job = await double.aenqueue(21)
    await drain(app)
    assert seen == [(42, State.RUNNING)]  # the job was not acked yet
    assert await job.astatus() is State.SUCCEEDED


async def test_an_after_success_that_raises_fails_the_attempt() -> None:
    """A success is only a success once its after-effects are done: the
    attempt is retried by the task's policy, the hook runs again."""
    calls: list[int] = []

    class FlakyEffect(dw.Middleware):
        async def after_success(self, ctx: dw.Context) -> None:
            calls.append(ctx.attempt)
            if ctx.attempt == 1:
                raise ConnectionError("the side effect's store is down")

    app = dw.App("memory://", retry=FAST, middleware=[FlakyEffect()])

    @app.task
    def work() -> None:
        pass

    job = await work.aenqueue()
    w = await drain(app)
    assert calls == [1, 2]
    assert (w.counts["retried"], w.counts["succeeded"]) == (1, 1)
    info = await job.ainfo()
    assert info is not None and info.state is State.SUCCEEDED
    # a compact record (brokers/finished.py) keeps the attempt, not the errors
    assert info.message.attempt == 2


async def test_on_dead_runs_awaited_before_the_dead_letter_is_stored() -> None:
    plain: list[str] = []
    stored: list[tuple[str, State | None]] = []

    class Plain(dw.Middleware):
        def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            plain.append(error.message)

    class Alert(dw.Middleware):
        async def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            assert ctx is not None
            stored.append((error.message, await _state(ctx)))

    app = dw.App("memory://", retry=FAST, middleware=[Plain(), Alert()])

    @app.task
    def broken() -> None:
        raise ValueError("no")

    await broken.aenqueue()
    await drain(app)
    assert plain == ["no"]  # a plain hook runs too, once
    assert stored == [("no", State.RUNNING)]  # what it records is there before the job is dead


async def test_a_hook_awaiting_what_only_it_holds_still_ends_in_a_settle() -> None:
    """A slot whose ``on_dead`` awaits a future that only the awaiting task
    keeps alive (a client library that holds its waiters weakly) is not
    lost to the garbage collector: asyncio holds tasks weakly, and the
    worker lets go of a job's task in its map when the handler returns.
    A Kafka batch test's drain timed out that way: a dead shard's slot was
    collected in its hook, and the job stayed running."""
    waiters: weakref.WeakSet[asyncio.Future[None]] = weakref.WeakSet()
    hooked = asyncio.Event()

    class WeakWait(dw.Middleware):
        async def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            f = asyncio.get_running_loop().create_future()
            waiters.add(f)
            hooked.set()
            await f

    app = dw.App("memory://", retry=dw.Retry(attempts=1), middleware=[WeakWait()])

    @app.task
    def broken() -> None:
        raise ValueError("no")

    async def wake() -> None:
        await hooked.wait()
        gc.collect()
        for f in list(waiters):
            f.set_result(None)

    job = await broken.aenqueue()
    waking = asyncio.ensure_future(wake())
    await drain(app, timeout=10)
    await waking
    assert await job.astatus() is State.DEAD


async def test_on_dead_hears_of_a_job_the_rescuer_buried() -> None:
    stored: list[tuple[str, State | None]] = []

    class Alert(dw.Middleware):
        async def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            assert ctx is not None
            stored.append((error.type, await _state(ctx)))

    app = dw.App("memory://", middleware=[Alert()])

    @app.task(retry=False)
    def lost() -> None:
        raise AssertionError("never runs: its only attempt was lost")

    await lost.aenqueue()
    [_] = await app.broker.fetch(["default"], 1, 0.1, 0, "w-dead")  # taken, never settled
    await drain(app, rescue_interval=0.05)
    assert stored == [("dumbwaiter.errors.LeaseExpired", State.DEAD)]


async def test_on_cancelled_runs_before_the_cancellation_is_stored() -> None:
    started, heard = asyncio.Event(), asyncio.Event()
    stored: list[tuple[str, State | None]] = []

    class Watch(dw.Middleware):
        async def on_cancelled(self, ctx: dw.Context) -> None:
            stored.append((ctx.job_id, await _state(ctx)))
            heard.set()

    app = dw.App("memory://", middleware=[Watch()])

    @app.task
    async def crunch(ctx: dw.Context) -> None:
        started.set()
        while True:
            ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)

    job = await crunch.aenqueue()
    w = dw.Worker(app, heartbeat=0.05, lease=5.0, fetch_wait=0.05)
    run = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(started.wait(), 30)
        await request_cancel(app.broker, [job.id], "test")
        await asyncio.wait_for(heard.wait(), 30)
    finally:
        w.stop()
        await asyncio.wait_for(run, 30)
    assert stored == [(job.id, State.RUNNING)]
    assert await job.astatus() is State.CANCELLED


async def test_the_apps_own_hooks_run_before_the_users() -> None:
    """Workflows are the app's innermost middleware: a user's after_success
    finds the next step of a chain already stored."""
    found: list[tuple[str, bool]] = []

    class Watch(dw.Middleware):
        async def after_success(self, ctx: dw.Context) -> None:
            meta = ctx.message.headers["wf"]
            following = derived_id(meta["id"], str(int(meta["i"]) + 1))
            found.append((ctx.name, await ctx.app.broker.get(following) is not None))

    app = dw.App("memory://", middleware=[Watch()])

    @app.task
    def first(n: int) -> int:
        return n + 1

    @app.task
    def second(n: int) -> int:
        return n * 10

    wf = await dw.chain(first.s(1), second.s()).aenqueue()
    await drain(app)
    assert await wf.aresult(timeout=5) == 20
    assert found == [(first.name, True), (second.name, False)]


async def test_an_after_success_written_as_a_plain_def_still_runs() -> None:
    seen: list[object] = []

    class Plain(dw.Middleware):
        def after_success(self, ctx: dw.Context) -> None:
            seen.append(ctx.state["result"])

    app = dw.App("memory://", middleware=[Plain()])

    @app.task
    def one() -> int:
        return 1

    await one.aenqueue()
    await drain(app)
    assert seen == [1]


async def test_a_middleware_narrowed_to_a_header_hears_only_of_jobs_that_carry_it() -> None:
    """``only_with_header``: the lifecycle hooks of such a middleware run for
    the jobs whose message has the header, succeeded or dead, and for no
    other; an unnarrowed one still hears of every job."""
    tenant: list[tuple[str, str | None]] = []
    every: list[int] = []

    class TenantAudit(dw.Middleware):
        only_with_header = "tenant"

        async def after_success(self, ctx: dw.Context) -> None:
            tenant.append(("ok", ctx.message.headers.get("tenant")))

        async def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            assert ctx is not None
            tenant.append(("dead", ctx.message.headers.get("tenant")))

    class Every(dw.Middleware):
        def after_success(self, ctx: dw.Context) -> None:
            every.append(ctx.state["result"])

    app = dw.App("memory://", middleware=[TenantAudit(), Every()])

    @app.task(retry=dw.Retry.never())
    def work(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    await work.aenqueue(1)
    await work.options(headers={"tenant": "acme"}).aenqueue(2)
    await work.options(headers={"tenant": "initech"}).aenqueue(-1)
    await work.aenqueue(-2)
    await drain(app)
    assert sorted(tenant) == [("dead", "initech"), ("ok", "acme")]
    assert sorted(every) == [1, 2]


async def test_a_worker_stopping_while_its_rescuer_buries_a_job_still_reports_it() -> None:
    """The stop comes while a rescue pass is under way (the broker has
    buried a job, and has more to do in that pass: RabbitMQ's reconcile,
    say): the worker lets the pass end, so ``on_dead`` hears of the job;
    nothing else would ever report it."""
    seen: list[str] = []

    class Alert(dw.Middleware):
        def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            seen.append(error.type)

    app = dw.App("memory://", middleware=[Alert()])

    @app.task(retry=False)
    def lost() -> None:
        raise AssertionError("never runs: its only attempt was lost")

    await lost.aenqueue()
    [_] = await app.broker.fetch(["default"], 1, 0.05, 0, "w-dead")  # taken, never settled
    w = dw.Worker(app, rescue_interval=0.05, fetch_wait=0.05)
    rescue = app.broker.rescue

    async def slow_rescue() -> Rescued:
        done = await rescue()
        if done.dead:  # buried: the worker stops before this pass ends
            w.stop()
            [heartbeat] = [t for t in asyncio.all_tasks() if t.get_name() == "heartbeat"]
            await asyncio.wait({heartbeat})  # the stop has cancelled the side services
        return done

    app.broker.rescue = slow_rescue  # type: ignore[method-assign]
    await asyncio.wait_for(w.run(), 30)
    assert seen == ["dumbwaiter.errors.LeaseExpired"]


async def test_a_shard_the_rescuer_buried_fails_its_batch() -> None:
    """A batch hears of a shard whose worker was lost on its last attempt (the
    rescuer's dead letter reaches the batch's ``on_dead``), so it finishes."""
    app = dw.App("memory://")
    called = asyncio.Event()
    failures: list[dict[str, object]] = []

    @app.task(retry=False)
    def shard(items: list[int]) -> None:
        raise AssertionError("never runs: its only attempt was lost")

    @app.task
    def failed(summary: dict[str, object]) -> None:
        failures.append(summary)
        called.set()

    batch = await app.abatch(shard, [1, 2], chunk_size=2, on_failure=failed.s())
    [_] = await app.broker.fetch(["default"], 1, 0.1, 0, "w-dead")  # taken, never settled
    w = dw.Worker(app, rescue_interval=0.05, fetch_wait=0.05)
    run = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(called.wait(), 30)
    finally:
        w.stop()
        await asyncio.wait_for(run, 30)
    progress = await batch.aprogress()
    assert (progress["state"], progress["failed"]) == ("failed", 1)
    assert [f["failed"] for f in failures] == [1]
