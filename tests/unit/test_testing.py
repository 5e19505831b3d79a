"""dumbwaiter.testing: drain (sync and async), isolate and its Harness, eager mode.

These are what users' test suites lean on, so each is tested the way a user
uses it: a user's app (on a URL the test never reaches), its tasks, and what
the user can see afterwards.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.blocking import BlockingCallWarning
from dumbwaiter.state import State
from dumbwaiter.testing import Harness, drain, drain_sync, isolate

SLOW = dw.Retry(attempts=3, backoff=3600, jitter=0)  # a test that waited would time out


@pytest.fixture
def user_app(tmp_path: Path) -> Iterator[dw.App]:
    """An app as a user builds it, on a broker no test here may touch."""
    app = dw.App(f"sqlite:///{tmp_path / 'production.db'}", retry=SLOW)
    yield app
    app.close()
    assert not (tmp_path / "production.db").exists(), "the app's own broker was used"


class Paid(dw.Event, type="testing.paid", version=2):
    order: str
    cents: int


# -- drain ---------------------------------------------------------------------


def test_drain_sync_runs_every_job_from_sync_code() -> None:
    app = dw.App("memory://")
    done: list[int] = []

    @app.task
    def work(n: int) -> None:
        done.append(n)

    work.enqueue_many([1, 2, 3])
    worker = drain_sync(app)
    assert sorted(done) == [1, 2, 3]
    assert worker.counts["succeeded"] == 3
    app.close()


async def test_a_drain_that_times_out_names_the_jobs_left() -> None:
    app = dw.App("memory://")

    @app.task
    def later(n: int) -> None: ...

    job = await later.options(delay=3600).aenqueue(7)
    with pytest.raises(TimeoutError) as raised:
        await drain(app, timeout=0.05)
    said = str(raised.value)
    assert "default: 0 ready, 0 running, 1 scheduled, 0 retrying" in said
    assert f"later {job.id} scheduled attempt 0" in said
    await app.aclose()


async def test_drain_sync_works_under_a_running_event_loop() -> None:
    app = dw.App("memory://")

    @app.task
    async def work(n: int) -> int:
        return n

    await work.aenqueue(1)
    assert drain_sync(app).counts["succeeded"] == 1  # blocks here, runs on the app's loop
    assert (await drain(app)).counts["succeeded"] == 0
    app.close()


# -- isolate and the Harness ---------------------------------------------------


def test_isolate_runs_the_users_app_on_a_private_memory_broker(user_app: dw.App) -> None:
    own_broker, own_middleware = user_app.broker, user_app.middleware

    @user_app.task(queue="mail")
    def send_welcome(user_id: int, *, template: str = "welcome") -> None: ...

    with isolate(user_app) as dwt:
        assert user_app.broker is not own_broker
        send_welcome.enqueue(1)
        send_welcome.options(delay=60, priority=3).enqueue(2, template="late")
        [first, second] = dwt.enqueued(send_welcome)
        assert (first.args, first.kwargs, first.queue) == ([1], {}, "mail")
        assert (second.args, second.kwargs, second.priority) == ([2], {"template": "late"}, 3)
        assert second.eta is not None
        assert dwt.enqueued("send_welcome") == dwt.enqueued(send_welcome.name) == [first, second]
        assert dwt.enqueued("welcome") == []
        assert user_app.job(first.id).status() is State.READY
    assert (user_app.broker, user_app.middleware) == (own_broker, own_middleware)

    with isolate(user_app) as dwt:  # the next test starts empty
        assert dwt.enqueued() == []
        assert dwt.drain().counts["succeeded"] == 0


def test_harness_lists_published_events_as_the_event_class(user_app: dw.App) -> None:
    @user_app.upcast("testing.paid", from_version=1)
    def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
        return {"order": payload["order"], "cents": payload["euros"] * 100}

    with isolate(user_app) as dwt:
        user_app.publish(Paid(order="o-1", cents=1200), key="o-1")
        assert dwt.published(Paid) == [Paid(order="o-1", cents=1200)]
        [envelope] = dwt.published("testing.paid")
        assert (envelope.payload, envelope.key) == ({"order": "o-1", "cents": 1200}, "o-1")
        assert dwt.published() == [envelope]
        # an older version in the record comes back upgraded, as a subscriber gets it
        old = envelope.copy()
        old.payload, old.headers["schema_version"] = {"order": "o-0", "euros": 3}, 1
        dwt.recorder.events.insert(0, old)
        assert dwt.published(Paid) == [Paid(order="o-0", cents=300), Paid(order="o-1", cents=1200)]
        dwt.clear()
        assert dwt.published() == [] and dwt.enqueued() == []


async def test_harness_adrain_runs_the_recorded_jobs(user_app: dw.App) -> None:
    ran: list[str] = []

    @user_app.task
    async def index(doc: str) -> None:
        ran.append(doc)

    with isolate(user_app) as dwt:
        await index.aenqueue("a")
        assert ran == []  # not eager: nothing runs until drained
        worker = await dwt.adrain()
        assert ran == ["a"] and worker.counts["succeeded"] == 1


# -- eager mode ------------------------------------------------------------------


def test_eager_runs_the_job_and_what_it_enqueues_before_enqueue_returns(
    user_app: dw.App,
) -> None:
    ran: list[tuple[str, Any]] = []

    @user_app.task(keep_result=True)
    def order(n: int) -> int:
        ran.append(("order", n))
        receipt.enqueue(n)  # from a worker thread, inside the eager run
        return n * 10

    @user_app.task(queue="mail")
    async def receipt(n: int) -> None:
        ran.append(("receipt", n))

    with isolate(user_app, eager=True) as dwt:
        job = order.enqueue(7)
        assert ran == [("order", 7), ("receipt", 7)]
        assert job.status() is State.SUCCEEDED and job.result() == 70
        assert [m.name for m in dwt.enqueued()] == [order.name, receipt.name]
    assert user_app.eager is False


async def test_eager_aenqueue_and_events_run_inline(user_app: dw.App) -> None:
    got: list[Any] = []

    @user_app.task(keep_result=True)
    async def total(cents: list[int]) -> int:
        await user_app.apublish(Paid(order="o-9", cents=sum(cents)))
        return sum(cents)

    @user_app.subscribe(Paid, group="billing")
    def bill(event: Paid, ctx: dw.Context) -> None:
        got.append((event, ctx.attempt))

    with isolate(user_app, eager=True) as dwt:
        job = await total.aenqueue([100, 250])
        assert await job.aresult() == 350
        assert got == [(Paid(order="o-9", cents=350), 1)]
        assert dwt.published(Paid) == [Paid(order="o-9", cents=350)]
        with pytest.warns(BlockingCallWarning, match="apublish"):
            user_app.publish(Paid(order="o-10", cents=1))  # sync publish too
        assert got[-1] == (Paid(order="o-10", cents=1), 1)


def test_eager_arguments_go_through_json_as_in_production(user_app: dw.App) -> None:
    seen: list[Any] = []

    @user_app.task
    def keep(pair: Any, options: dict[str, Any]) -> None:
        seen.append((pair, options))

    with isolate(user_app, eager=True):
        keep.enqueue((1, 2), {"at": (3, 4)})
        assert seen == [([1, 2], {"at": [3, 4]})]  # what a worker decodes, not the tuples
        with pytest.raises(dw.SerializationError, match="argument 'pair'"):
            keep.enqueue({1, 2}, {})
        with pytest.raises(dw.SerializationError, match="options"):
            keep.enqueue_many([((1, 2), {"when": object()})])
        assert len(seen) == 1


def test_eager_retries_by_the_tasks_policy_without_waiting(user_app: dw.App) -> None:
    attempts: list[int] = []

    @user_app.task(keep_result=True)  # the app's policy: 3 attempts, an hour apart
    def flaky(ctx: dw.Context) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("down")
        return "ok"

    @user_app.task(retry=dw.Retry(attempts=2, backoff=3600, dead_on=KeyError))
    def broken(key: str) -> None:
        attempts.append(-1)
        raise KeyError(key)

    @user_app.task
    def later(ctx: dw.Context) -> None:
        attempts.append(100 + ctx.attempt)
        if ctx.attempt == 1:
            raise dw.RetryLater(after=3600)

    with isolate(user_app, eager=True):
        assert flaky.enqueue().result() == "ok" and attempts == [1, 2, 3]
        dead = broken.enqueue("k")
        assert dead.status() is State.DEAD and attempts[3:] == [-1]
        with pytest.raises(dw.JobFailed, match="KeyError"):
            dead.result()
        later.enqueue()
        assert attempts[4:] == [101, 102]


def test_eager_does_not_wait_for_a_delay_or_eta(user_app: dw.App) -> None:
    ran: list[int] = []

    @user_app.task
    def remind(n: int) -> None:
        ran.append(n)

    with isolate(user_app, eager=True) as dwt:
        remind.options(delay=3600).enqueue(1)
        assert ran == [1]
        assert dwt.enqueued(remind)[0].eta is not None  # the record keeps what was asked


def test_eager_workflows_finish_inside_enqueue(user_app: dw.App) -> None:
    @user_app.task
    def double(n: int) -> int:
        return n * 2

    @user_app.task
    def total(ns: list[int]) -> int:
        return sum(ns)

    with isolate(user_app, eager=True):
        assert dw.chain(double.s(1), double.s(), double.s()).enqueue().result(timeout=5) == 8
        chord = dw.chord(dw.group(double.s(i) for i in range(4)), total.s())
        assert chord.enqueue().result(timeout=5) == 12


def test_app_eager_true_runs_inline_from_other_threads_too() -> None:
    app = dw.App("memory://", eager=True)
    threads: list[str] = []

    @app.task(keep_result=True)
    def who() -> str:
        return threading.current_thread().name

    def caller() -> None:
        threads.append(who.enqueue().result())

    t = threading.Thread(target=caller)
    t.start()
    t.join(timeout=30)
    assert len(threads) == 1 and threads[0].startswith("dumbwaiter-job")
    app.close()


async def test_a_sync_enqueue_under_a_running_loop_runs_eagerly(user_app: dw.App) -> None:
    ran: list[str] = []

    @user_app.task
    async def ping() -> None:
        ran.append("ping")

    with isolate(user_app, eager=True):
        # a sync caller inside async code: it runs, and is told it blocks the loop
        with pytest.warns(BlockingCallWarning, match="aenqueue"):
            ping.enqueue()
        assert ran == ["ping"]
        await asyncio.sleep(0)


def test_harness_eager_switch(user_app: dw.App) -> None:
    ran: list[int] = []

    @user_app.task
    def note(n: int) -> None:
        ran.append(n)

    with isolate(user_app) as dwt:
        assert isinstance(dwt, Harness) and dwt.eager is False
        note.enqueue(1)
        dwt.eager = True
        note.enqueue(2)
        assert ran == [1, 2]  # running 2 ran what was waiting too: the queue drains
        dwt.eager = False
        note.enqueue(3)
        assert ran == [1, 2]
