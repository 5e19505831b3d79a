"""The worker over the memory broker: outcomes, retries, timeouts, middleware."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.message import TASK, Message, uuid7
from dumbwaiter.state import State
from dumbwaiter.testing import drain

FAST = dw.Retry(attempts=3, backoff=(0.01, 0.02), jitter=0)


@pytest.fixture
def app() -> dw.App:
    return dw.App("memory://", retry=FAST)


async def test_sync_and_async_tasks_run_and_keep_results(app: dw.App) -> None:
    calls: list[str] = []

    @app.task(keep_result=True)
    def add(a: int, b: int) -> int:
        calls.append(threading.current_thread().name)
        return a + b

    @app.task(keep_result=60)
    async def greet(name: str, *, punct: str = "!") -> str:
        return f"hi {name}{punct}"

    j1 = await add.aenqueue(2, 3)
    j2 = await greet.aenqueue("ana", punct="?")
    w = await drain(app)
    assert await j1.aresult(timeout=5) == 5
    assert await j2.aresult(timeout=5) == "hi ana?"
    assert calls and calls[0].startswith("dumbwaiter-job")  # sync tasks run in the pool
    assert w.counts["succeeded"] == 2


async def test_failures_retry_then_go_dead_with_every_error(app: dw.App) -> None:
    attempts: list[int] = []

    @app.task
    def flaky(ctx: dw.Context) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"fail {ctx.attempt}")

    job = await flaky.aenqueue()
    w = await drain(app)
    assert attempts == [1, 2, 3]
    assert {k: n for k, n in w.counts.items() if n} == {"retried": 2, "dead": 1}
    info = await job.ainfo()
    assert info is not None and info.state is State.DEAD
    assert [e.message for e in info.message.errors] == ["fail 1", "fail 2", "fail 3"]
    assert all(e.type == "ValueError" and "Traceback" in e.traceback for e in info.message.errors)
    assert all(e.worker == w.id for e in info.message.errors)
    with pytest.raises(dw.JobFailed, match="ValueError: fail 3"):
        await job.aresult(timeout=1)


async def test_success_after_a_retry(app: dw.App) -> None:
    seen: list[int] = []

    @app.task(keep_result=True)
    def once_broken(ctx: dw.Context) -> str:
        seen.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("partner down")
        return "ok"

    job = await once_broken.aenqueue()
    await drain(app)
    assert await job.aresult(timeout=1) == "ok"
    info = await job.ainfo()
    assert info is not None and [e.type for e in info.message.errors] == ["ConnectionError"]


async def test_retry_on_and_dead_on_choose_by_exception_type(app: dw.App) -> None:
    runs: dict[str, int] = {"retry_on": 0, "dead_on": 0}

    @app.task(retry=dw.Retry(attempts=5, backoff=0.01, retry_on=(ConnectionError,)))
    def only_conn(kind: str) -> None:
        runs["retry_on"] += 1
        raise (ConnectionError if runs["retry_on"] < 2 else KeyError)(kind)

    @app.task(retry=dw.Retry(attempts=5, backoff=0.01, dead_on=KeyError))
    def dead_on_key() -> None:
        runs["dead_on"] += 1
        raise KeyError("missing")

    a = await only_conn.aenqueue("x")
    b = await dead_on_key.aenqueue()
    await drain(app)
    assert runs == {"retry_on": 2, "dead_on": 1}
    assert await a.astatus() == State.DEAD and await b.astatus() == State.DEAD


async def test_retry_later_and_reject(app: dw.App) -> None:
    times: list[float] = []

    @app.task(keep_result=True)
    def later(ctx: dw.Context) -> int:
        times.append(time.time())
        if ctx.attempt == 1:
            raise dw.RetryLater(after=0.2, reason="not yet")
        return ctx.attempt

    @app.task
    def refuse() -> None:
        raise dw.Reject("order o-1 does not exist")

    a = await later.aenqueue()
    b = await refuse.aenqueue()
    await drain(app)
    assert await a.aresult(timeout=1) == 2
    assert times[1] - times[0] >= 0.19
    info = await b.ainfo()
    assert info is not None and info.state is State.DEAD and info.message.attempt == 1
    [err] = info.message.errors
    assert err.type == "dumbwaiter.retry.Reject" and err.message == "order o-1 does not exist"


async def test_async_timeout_is_a_retryable_failure(app: dw.App) -> None:
    @app.task(timeout=0.05, retry=dw.Retry.never())
    async def slow() -> None:
        await asyncio.sleep(30)

    job = await slow.aenqueue()
    await drain(app)
    info = await job.ainfo()
    assert info is not None and info.state is State.DEAD
    assert info.message.errors[0].type == "dumbwaiter.errors.JobTimeout"


async def test_sync_timeout_fails_the_job_and_holds_the_slot(app: dw.App) -> None:
    release = threading.Event()

    @app.task(timeout=0.05, retry=dw.Retry.never())
    def stuck() -> None:
        release.wait(10)

    job = await stuck.aenqueue()
    worker = dw.Worker(app, concurrency=1, fetch_wait=0.05)
    run = asyncio.create_task(worker.run())
    info = None
    for _ in range(500):
        info = await job.ainfo()
        if info is not None and info.state is State.DEAD:
            break
        await asyncio.sleep(0.01)
    assert info is not None and info.state is State.DEAD
    assert "cannot be stopped" in info.message.errors[0].message
    # its thread still runs, so the only slot stays taken: a new job waits
    other = await stuck.aenqueue()
    await asyncio.sleep(0.2)
    assert await other.astatus() == State.READY
    release.set()
    for _ in range(500):
        if await other.astatus() != State.READY:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await run


async def test_bad_messages_are_dead_lettered_with_the_reason(app: dw.App) -> None:
    @app.task
    def takes_one(x: int) -> None: ...

    from dumbwaiter.message import TASK, Message, uuid7

    unknown = Message(id=uuid7(), kind=TASK, name="no.such.task", queue="default", max_attempts=3)
    wrong_args = Message(
        id=uuid7(), kind=TASK, name=takes_one.name, queue="default", args=[1, 2], max_attempts=3
    )
    await app.broker.enqueue([unknown, wrong_args])
    w = await drain(app)
    assert w.counts["dead"] == 2
    u, a = await app.job(unknown.id).ainfo(), await app.job(wrong_args.id).ainfo()
    assert u is not None and a is not None
    assert u.message.errors[0].type == "dumbwaiter.errors.UnknownTask"
    assert "no.such.task" in u.message.errors[0].message
    assert u.message.attempt == 1  # not retried: it cannot work until code changes
    assert a.message.errors[0].type == "dumbwaiter.errors.InvalidArguments"
    assert "too many positional arguments" in a.message.errors[0].message


async def test_context_is_injected_and_reachable(app: dw.App) -> None:
    seen: dict[str, Any] = {}

    @app.task(queue="email")
    def with_ctx(user_id: int, ctx: dw.Context) -> None:
        seen.update(
            job_id=ctx.job_id, attempt=ctx.attempt, queue=ctx.queue, current=dw.Context.current()
        )

    @app.task(queue="email")
    async def async_ctx(c: dw.Context) -> None:
        seen["async_current"] = dw.Context.current() is c

    job = await with_ctx.aenqueue(7)
    await async_ctx.aenqueue()
    await drain(app, queues=("email",))
    assert seen["job_id"] == job.id and seen["attempt"] == 1 and seen["queue"] == "email"
    assert seen["current"] is not None and seen["current"].job_id == job.id
    assert seen["async_current"] is True


async def test_middleware_hooks_in_order_and_failures_contained() -> None:
    events: list[str] = []

    class Recorder(dw.Middleware):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def before_enqueue(self, message: dw.Message) -> None:
            message.headers[self.tag] = "seen"
            events.append(f"{self.tag}.before_enqueue")

        def before_process(self, ctx: dw.Context) -> None:
            events.append(f"{self.tag}.before_process")

        async def around_process(self, ctx: dw.Context, call_next: Any) -> Any:
            events.append(f"{self.tag}.around_in")
            try:
                return await call_next()
            finally:
                events.append(f"{self.tag}.around_out")

        def after_process(self, ctx: dw.Context, result: Any, exc: BaseException | None) -> None:
            events.append(f"{self.tag}.after_process")
            raise RuntimeError("a broken hook must not lose the job")

        def on_dead(self, ctx: dw.Context | None, error: Any) -> None:
            events.append(f"{self.tag}.on_dead")

    app = dw.App("memory://", middleware=[Recorder("outer"), Recorder("inner")])

    @app.task(keep_result=True, retry=False)
    def job(ctx: dw.Context) -> dict[str, Any]:
        events.append("task")
        return dict(ctx.headers)

    j = await job.aenqueue()
    await drain(app)
    assert await j.aresult(timeout=1) == {"outer": "seen", "inner": "seen"}
    assert events == [
        "outer.before_enqueue",
        "inner.before_enqueue",
        "outer.before_process",
        "inner.before_process",
        "outer.around_in",
        "inner.around_in",
        "task",
        "inner.around_out",
        "outer.around_out",
        "inner.after_process",
        "outer.after_process",
    ]
    assert app.middleware.errors == 2


async def test_reject_from_middleware_dead_letters() -> None:
    class Gate(dw.Middleware):
        def before_process(self, ctx: dw.Context) -> None:
            raise dw.Reject("tenant suspended")

    app = dw.App("memory://", middleware=[Gate()])
    ran: list[int] = []

    @app.task
    def job() -> None:
        ran.append(1)

    j = await job.aenqueue()
    await drain(app)
    assert ran == []
    info = await j.ainfo()
    assert info is not None and info.message.errors[0].message == "tenant suspended"


async def test_unknown_task_option_fails_at_declaration(app: dw.App) -> None:
    with pytest.raises(dw.ConfigurationError, match="unknown task option"):

        @app.task(retries=3)  # type: ignore[call-overload, untyped-decorator]
        def f() -> None: ...


async def test_graceful_stop_gives_unfinished_jobs_back_uncharged(app: dw.App) -> None:
    started = asyncio.Event()

    @app.task
    async def long() -> None:
        started.set()
        await asyncio.sleep(60)

    job = await long.aenqueue()
    worker = dw.Worker(app, concurrency=2, grace=0.1)
    run = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop()
    await run
    info = await job.ainfo()
    assert info is not None and info.state is State.READY
    assert info.message.attempt == 0 and info.message.errors == []
    assert worker.counts["requeued"] == 1


async def test_graceful_stop_lets_running_jobs_finish(app: dw.App) -> None:
    started, finish = asyncio.Event(), asyncio.Event()

    @app.task
    async def short() -> None:
        started.set()
        await finish.wait()

    job = await short.aenqueue()
    worker = dw.Worker(app, concurrency=2, grace=30)
    run = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop()
    finish.set()
    await run
    assert await job.astatus() == State.SUCCEEDED


async def test_undecodable_body_is_dead_lettered_and_others_still_run(tmp_path: Any) -> None:
    import sqlite3

    app = dw.App(f"sqlite:///{tmp_path}/bad.db")

    @app.task
    def fine(i: int) -> None: ...

    good = await fine.aenqueue(1)
    conn = sqlite3.connect(f"{tmp_path}/bad.db")
    conn.execute(
        "INSERT INTO dw_jobs (id, queue, name, kind, state, run_at, updated_at, max_attempts,"
        " body) VALUES ('garbage-1', 'default', '?', 'task', 'ready', 0, 0, 3, x'7b6e6f7420')"
    )
    # a row written behind the broker's back: count it as the broker would
    conn.execute("UPDATE dw_counts SET n = n + 1 WHERE queue = 'default' AND state = 'ready'")
    conn.commit()
    conn.close()
    w = await drain(app)
    assert {k: n for k, n in w.counts.items() if n} == {"succeeded": 1, "dead": 1}
    assert await good.astatus() == State.SUCCEEDED
    bad = await app.job("garbage-1").ainfo()
    assert bad is not None and bad.state is State.DEAD
    assert bad.message.errors[0].type == "dumbwaiter.errors.MessageDecodeError"
    assert bad.raw == b"{not "
    await app.aclose()


async def test_a_body_that_is_not_utf8_is_dead_lettered_saying_so(tmp_path: Any) -> None:
    """orjson words invalid UTF-8 as "str is not valid UTF-8: surrogates not
    allowed"; the dead letter names the byte and its offset instead."""
    import sqlite3

    app = dw.App(f"sqlite:///{tmp_path}/bad.db")

    @app.task
    def fine(i: int) -> None: ...

    job = await fine.aenqueue(1)
    conn = sqlite3.connect(f"{tmp_path}/bad.db")
    conn.execute("UPDATE dw_jobs SET body = ? WHERE id = ?", (b'{"id": "\xff"}', job.id))
    conn.commit()
    conn.close()
    await drain(app)
    info = await job.ainfo()
    assert info is not None and info.state is State.DEAD
    [error] = info.message.errors
    assert error.type == "dumbwaiter.errors.MessageDecodeError"
    assert error.message.startswith(
        "message body is not valid UTF-8 (byte 0xff at offset 8: invalid start byte)"
    )
    assert "surrogates" not in error.message
    await app.aclose()


async def test_dead_letter_log_lines_name_the_task(
    app: dw.App, caplog: pytest.LogCaptureFixture
) -> None:
    """The task's name is in the dead-letter line whenever the message carries
    it, also when no handler ran (unknown task, arguments that do not fit)."""

    @app.task
    def two(a: int, b: int) -> None: ...

    def job(name: str, args: list[Any]) -> Message:
        return Message(id=uuid7(), kind=TASK, name=name, queue="default", args=args)

    # one argument: as if a deploy had added a parameter since it was enqueued
    unfit, unknown = await app.broker.enqueue([job(two.name, [1]), job("gone.task", [])])
    with caplog.at_level("WARNING", logger="dumbwaiter"):
        await drain(app)
    lines = {r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()}
    assert any(line.startswith(f"job {unfit} ({two.name}) ") for line in lines), lines
    assert any(line.startswith(f"job {unknown} (gone.task) ") for line in lines), lines
    assert not any("(?)" in line for line in lines)


async def test_queues_are_taken_in_turn(app: dw.App) -> None:
    order: list[str] = []

    @app.task(queue="a")
    async def in_a() -> None:
        order.append("a")

    @app.task(queue="b")
    async def in_b() -> None:
        order.append("b")

    await in_a.aenqueue_many([() for _ in range(50)])
    await in_b.aenqueue_many([() for _ in range(50)])
    await drain(app, queues=("a", "b"), concurrency=4)
    assert order[:4] == ["a"] * 4  # the first fetch starts with "a"
    assert "b" in order[:12]  # but "b" is not starved until "a" is empty


async def test_stopping_an_idle_worker_does_not_wait_for_its_fetch(app: dw.App) -> None:
    fetching = asyncio.Event()
    real_fetch = app.broker.fetch

    async def spy(*args: Any, **kwargs: Any) -> Any:
        fetching.set()
        return await real_fetch(*args, **kwargs)

    app.broker.fetch = spy  # type: ignore[method-assign]
    worker = dw.Worker(app, concurrency=2, fetch_wait=3600)
    run = asyncio.create_task(worker.run())
    await fetching.wait()  # the first fetch is waiting on an empty queue
    await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(run, 10)  # not the fetch's hour


async def test_side_services_run_with_the_worker_and_a_crash_stops_it(app: dw.App) -> None:
    ran = asyncio.Event()
    cancelled = asyncio.Event()

    async def steady(worker: dw.Worker) -> None:
        ran.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async def broken(worker: dw.Worker) -> None:
        await ran.wait()
        raise RuntimeError("relay lost its database")

    worker = dw.Worker(app, concurrency=1, services=[steady, broken])
    await asyncio.wait_for(worker.run(), 10)  # the crash stops the worker
    assert ran.is_set() and cancelled.is_set()


async def test_live_workers_announce_themselves_in_the_broker(app: dw.App) -> None:
    from dumbwaiter.worker import WORKER_KEY

    started = asyncio.Event()

    class Hook(dw.Middleware):
        def on_worker_start(self, worker: dw.Worker) -> None:
            started.set()

    app.middleware = type(app.middleware)([Hook()])
    worker = dw.Worker(app, concurrency=3, queues=("default", "email"))
    run = asyncio.create_task(worker.run())
    await started.wait()  # announced before the start hooks run
    [raw] = (await app.broker.kv_scan(WORKER_KEY)).values()
    import orjson

    info = orjson.loads(raw)
    assert info["id"] == worker.id and info["queues"] == ["default", "email"]
    assert info["concurrency"] == 3 and info["heartbeat_at"] > 0
    worker.stop()
    await run
    assert await app.broker.kv_scan(WORKER_KEY) == {}  # gone when it stops


async def test_a_job_the_rescuer_dead_letters_reaches_on_dead() -> None:
    """A worker that dies on a job's last attempt never calls ``on_dead``; the
    rescuer that dead-letters the job does, so the dead-letter metric and user
    middleware count it like any other, labelled with its queue and task."""
    from prometheus_client import CollectorRegistry

    from dumbwaiter.message import ErrorRecord
    from dumbwaiter.metrics import PrometheusMiddleware

    seen: list[tuple[str, str, str, str]] = []

    class Watch(dw.Middleware):
        def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
            assert ctx is not None
            seen.append((ctx.job_id, ctx.queue, ctx.name, error.type))

    registry = CollectorRegistry()
    app = dw.App("memory://", middleware=[PrometheusMiddleware(registry), Watch()])

    @app.task(queue="mail", retry=False)
    def send() -> None:
        raise AssertionError("never runs: its only attempt was lost")

    job = await send.aenqueue()
    # a worker took the job and died: its lease runs out, nobody settles it
    [_] = await app.broker.fetch(["mail"], 1, 0.1, 0, "w-dead")
    w = await drain(app, rescue_interval=0.05)  # drained once the rescuer buried it
    info = await job.ainfo()
    assert info is not None and info.state is State.DEAD
    assert seen == [(job.id, "mail", send.name, "dumbwaiter.errors.LeaseExpired")]
    labels = {"queue": "mail", "task": send.name}
    assert registry.get_sample_value("dumbwaiter_jobs_dead_total", labels) == 1
    assert w.counts["rescued"] == 1


async def _until_buffered(worker: dw.Worker, left: int) -> None:
    """Until the worker's prefetch holds a job, if any of the ``left`` jobs
    not started yet is still to fetch (the running job's slot takes its
    next job from there when it ends)."""
    deadline = time.monotonic() + 5.0
    while left and not worker._buffer:  # the worker's buffer has no event to wait on
        assert time.monotonic() < deadline, "the prefetch never refilled the buffer"
        await asyncio.sleep(0.001)


async def test_a_freed_slot_starts_its_next_buffered_job_without_a_loop_turn(app: dw.App) -> None:
    """When a job ends and a prefetched job waits, the slot's task starts it at
    once: no other callback of the loop runs in between (a new task per job
    would wait behind every job that ended in the same wave of timers)."""
    n = 30
    starts: list[int] = []
    turned: list[bool] = []  # per start: did the loop turn since the previous job ended?
    flag = {"turn": True}
    holder: dict[str, dw.Worker] = {}

    def loop_turned() -> None:
        flag["turn"] = True

    @app.task
    async def step(i: int) -> None:
        turned.append(flag["turn"])
        starts.append(i)
        if len(starts) > 1:  # the prefetch is sized by the jobs' run time: none before one ended
            await _until_buffered(holder["w"], n - len(starts))
        flag["turn"] = False
        asyncio.get_running_loop().call_soon(loop_turned)
        if len(starts) == n:
            done.set()

    done = asyncio.Event()
    await step.aenqueue_many(range(n))
    worker = holder["w"] = dw.Worker(app, concurrency=1, fetch_wait=0.1)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 30)
    worker.stop()
    await run
    assert sorted(starts) == list(range(n))
    # a job waits for the first fetch, the second for the fetch that the first
    # job's run time sized; every later one found its job in the buffer
    assert turned[2:] == [False] * (n - 2)


async def test_stop_ends_a_slot_s_run_of_buffered_jobs_and_gives_them_back(app: dw.App) -> None:
    """A slot that runs buffered jobs one after another stops taking them once
    ``stop()`` is called; the rest go back to the queue uncharged."""
    n = 40
    ran: list[int] = []
    holder: dict[str, dw.Worker] = {}

    buffered_at_stop: list[int] = []

    @app.task
    async def step(i: int) -> None:
        ran.append(i)
        await asyncio.sleep(0)  # it awaits, as async jobs do: the loop turns
        if len(ran) > 1:  # the prefetch is sized by the jobs' run time: none before one ended
            await _until_buffered(holder["w"], n - len(ran))
        if len(ran) == 20:
            buffered_at_stop.append(len(holder["w"]._buffer))
            holder["w"].stop()

    jobs = await step.aenqueue_many(range(n))
    worker = holder["w"] = dw.Worker(app, concurrency=1, grace=5)
    await worker.run()
    assert buffered_at_stop[0] > 0  # the slot had buffered jobs to run next
    # stop() takes effect at the loop's next turn: the job after it may start
    assert 20 <= len(ran) <= 21
    states = [await j.astatus() for j in jobs]
    assert states.count(State.SUCCEEDED) == len(ran)
    assert states.count(State.READY) == n - len(ran)
    for j in jobs:
        info = await j.ainfo()
        assert info is not None
        if info.state is State.READY:
            assert info.message.attempt == 0 and info.message.errors == []


async def test_a_worker_of_short_jobs_holds_up_to_twice_its_slots_in_reserve(app: dw.App) -> None:
    """Equal short jobs end in waves of every slot at once: the buffer keeps
    more than one wave (up to twice the concurrency) beyond the running jobs,
    and never more."""
    concurrency = 4
    held: list[int] = []
    holder: dict[str, dw.Worker] = {}
    done = asyncio.Event()

    @app.task
    async def step(i: int) -> None:
        await asyncio.sleep(0.002)
        held.append(len(holder["w"]._buffer))
        if len(held) == 200:
            done.set()

    await step.aenqueue_many(range(200))
    worker = dw.Worker(app, concurrency=concurrency, fetch_wait=0.1)
    holder["w"] = worker
    run = asyncio.create_task(worker.run())
    await done.wait()
    worker.stop()
    await run
    assert max(held) > concurrency
    assert max(held) <= 2 * concurrency
