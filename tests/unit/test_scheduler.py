"""The leader loop on the memory broker, driven by an injected clock.

Schedules' time is the ``clock`` the test moves; no test waits for a tick.
Replicas are several ``Scheduler`` objects on one named memory store, which
is what several processes on one broker look like to the seam.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.scheduler import (
    LOCK,
    Scheduler,
    list_schedules,
    pause,
    resume,
    state_key,
    trigger,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
NY = ZoneInfo("America/New_York")
_stores = itertools.count()


class Clock:
    """The schedules' wall clock, moved by the test."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def url() -> str:
    return f"memory://scheduler-test-{next(_stores)}"


def make_app(url: str) -> dw.App:
    """The same code in every replica: each call is one more process's App."""
    app = dw.App(url)

    @app.periodic(every=timedelta(seconds=10))
    def ping() -> None: ...

    @app.task
    def report(kind: str, *, days: int = 1) -> None: ...

    app.periodic(cron="0 3 * * *", tz="Asia/Taipei", args=("daily",), name="daily")(report)
    return app


async def keys(app: dw.App) -> list[str]:
    page = await app.broker.list_jobs(JobFilter(), limit=10_000)
    return sorted(i.message.key or "-" for i in page.items)


def ping_keys(*offsets: int) -> list[str]:
    return [
        f"periodic:{__name__}.make_app.<locals>.ping:"
        + datetime.fromtimestamp(T0 + o, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for o in offsets
    ]


async def test_the_leader_enqueues_each_due_tick_once_with_its_key(url: str) -> None:
    app, clock = make_app(url), Clock()
    s = Scheduler(app, clock=clock)
    await s.step()  # becomes leader; first sight of each schedule: nothing owed yet
    assert s.is_leader and await keys(app) == []
    clock.t = T0 + 25
    wait = await s.step()
    assert await keys(app) == ping_keys(10, 20)
    assert 0 < wait <= 5  # until the next tick (T0 + 30), or the next renewal
    await s.step()  # nothing new is due: nothing new is enqueued
    assert await keys(app) == ping_keys(10, 20)
    clock.t = T0 + 30
    await s.step()
    assert await keys(app) == ping_keys(10, 20, 30)
    msg = (await app.broker.list_jobs(JobFilter(), limit=1)).items[0].message
    assert msg.headers["periodic"]["by"] == s.owner and msg.queue == "default"


async def test_one_leader_among_replicas_and_a_clean_stop_hands_over(url: str) -> None:
    clock = Clock()
    a, b, c = (Scheduler(make_app(url), clock=clock, owner=o) for o in "abc")
    for s in (a, b, c):
        await s.step()
    assert [s.is_leader for s in (a, b, c)] == [True, False, False]
    clock.t = T0 + 10
    for s in (a, b, c):
        await s.step()
    await a.resign()  # a clean stop releases the lease
    clock.t = T0 + 20
    for s in (b, c):
        await s.step()
    assert (b.is_leader, c.is_leader) == (True, False)
    assert await keys(a.app) == ping_keys(10, 20)  # b took over where a stopped


async def test_two_leaders_at_once_still_enqueue_each_tick_once(url: str) -> None:
    """Split brain: both believe they lead (a paused process woke up).  The
    tick keys make the second enqueue of every tick a no-op."""
    clock = Clock()
    a, b = Scheduler(make_app(url), clock=clock, owner="a"), Scheduler(make_app(url), clock=clock)
    await a.step()
    # b is forced to believe it leads too, with the same token
    b.token, b._valid_until, b._renew_at = a.token, a._valid_until, a._renew_at
    await b.run_due(T0)
    for t in (T0 + 10, T0 + 25, T0 + 40):
        clock.t = t
        da = await a.run_due(t)
        db = await b.run_due(t)
        assert sum(len(d.duplicates) for d in da + db) == sum(len(d.enqueued) for d in db)
    assert await keys(a.app) == ping_keys(10, 20, 30, 40)


async def test_a_leader_that_sees_a_newer_token_steps_down(url: str) -> None:
    clock = Clock()
    old = Scheduler(make_app(url), clock=clock, owner="old")
    await old.step()
    new = Scheduler(make_app(url), clock=clock, owner="new")
    new.token, new._valid_until = (old.token or 0) + 1, old._valid_until
    clock.t = T0 + 10
    await new.run_due(clock.t)  # writes state under the newer token
    assert await old.run_due(T0 + 20) == []
    assert old.token is None and not old.is_leader
    assert await keys(old.app) == ping_keys(10)


async def test_no_tick_is_enqueued_once_the_lease_may_have_run_out(url: str) -> None:
    clock = Clock()
    s = Scheduler(make_app(url), clock=clock)
    await s.step()
    s._valid_until = 0.0  # the monotonic clock says the lease may be gone
    clock.t = T0 + 60
    assert await s.run_due(clock.t) == []
    assert await keys(s.app) == []
    await s.step()  # steps down, then takes the (still free) lease again, and catches up
    assert s.is_leader and await keys(s.app) == ping_keys(10, 20, 30, 40, 50, 60)


async def test_a_lost_lease_makes_the_leader_a_follower(url: str) -> None:
    a = Scheduler(make_app(url), clock=Clock(), owner="a", lease=5)
    await a.step()
    token = a.token  # a local: mypy would keep a.token narrowed across the step() below
    assert token is not None
    await a.broker.release(LOCK, "a", token)
    assert await a.broker.acquire(LOCK, "thief", 30) is not None
    a._renew_at = 0.0  # due for renewal
    await a.step()
    assert a.token is None and await a.step() == a.poll  # a follower polls


async def test_a_restart_continues_from_the_stored_mark(url: str) -> None:
    clock = Clock()
    first = Scheduler(make_app(url), clock=clock)
    await first.step()
    clock.t = T0 + 20
    await first.step()
    # the process dies (no release); a new one starts after the lease ran out
    await first.broker.release(LOCK, first.owner or "", first.token or 0)
    clock.t = T0 + 45
    second = Scheduler(make_app(url), clock=clock)
    await second.step()
    assert await keys(second.app) == ping_keys(10, 20, 30, 40)


async def test_missed_ticks_follow_the_policy_and_the_decision_is_logged(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    app = dw.App(url)

    @app.periodic(every=timedelta(minutes=1), missed="once", name="once")
    def job() -> None: ...

    app.periodic(every=timedelta(minutes=1), missed="all", catch_up=3, name="all")(job)
    app.periodic(every=timedelta(minutes=1), name="skip")(job)
    s = Scheduler(app, clock=clock)
    await s.step()
    clock.t = T0 + 3600 + 5  # every scheduler was down for an hour
    with caplog.at_level(logging.INFO, "dumbwaiter.scheduler"):
        await s.step()
    got = Counter(k.split(":")[1] for k in await keys(app))
    assert got == {"once": 2, "all": 4, "skip": 1}  # catch-ups + the on-time tick
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert any("schedule skip missed ticks" in w and "none of them" in w for w in warnings)
    assert any("running 3 of them as catch-up (missed='all'), 56 not run" in w for w in warnings)
    assert any("as a catch-up" in r.getMessage() for r in caplog.records)


def ny(*parts: int) -> float:
    return datetime(*parts, tzinfo=NY).timestamp()  # type: ignore[arg-type, misc]


async def ticks_over_two_days(cron: str, start: float) -> list[str]:
    """The tick labels a leader enqueues for ``cron`` (New York time) with a
    pass every 10 minutes for two days from ``start``."""
    app = dw.App(f"memory://dst-{next(_stores)}")

    @app.periodic(cron=cron, tz="America/New_York", name="job")
    def job() -> None: ...

    clock = Clock(start)
    s = Scheduler(app, clock=clock)
    await s.step()
    while clock.t < start + 2 * 86400:
        clock.t += 600
        await s.step()
    return [k.split(":", 2)[2] for k in await keys(app)]


async def test_daylight_saving_with_an_injected_clock() -> None:
    """As croniter defines it: on the fall-back night a daily 01:30 job runs at
    both 01:30s; on the spring-forward night a 02:30 job runs once, at 03:00."""
    assert await ticks_over_two_days("30 1 * * *", ny(2024, 11, 2, 12)) == [
        "2024-11-03T05:30:00Z",  # 01:30 EDT
        "2024-11-03T06:30:00Z",  # 01:30 EST, one hour later
        "2024-11-04T06:30:00Z",
    ]
    assert await ticks_over_two_days("30 2 * * *", ny(2024, 3, 9, 12)) == [
        "2024-03-10T07:00:00Z",  # 03:00 EDT: 02:30 did not exist that night
        "2024-03-11T06:30:00Z",  # 02:30 EDT
    ]
    assert await ticks_over_two_days("0 12 * * *", ny(2024, 3, 9, 13)) == [
        "2024-03-10T16:00:00Z",  # noon EDT
        "2024-03-11T16:00:00Z",
    ]


async def test_pause_holds_across_replicas_and_restarts(url: str) -> None:
    clock = Clock()
    app = make_app(url)
    name = next(n for n in app.schedules if n.endswith("ping"))
    s = Scheduler(app, clock=clock)
    await s.step()
    await pause(app.broker, name, "ops")
    clock.t = T0 + 20
    await s.step()
    await s.resign()
    # another replica (another process) takes over: still paused
    other = Scheduler(make_app(url), clock=clock)
    clock.t = T0 + 30
    await other.step()
    assert await keys(app) == []
    [info] = [i for i in await list_schedules(app, clock.t) if i.name == name]
    assert info.paused and info.last_run is None
    assert await resume(app.broker, name) and not await resume(app.broker, name)
    clock.t = T0 + 41
    await other.step()
    assert await keys(app) == ping_keys(40)  # ticks that fell while paused are not caught up


async def test_trigger_runs_now_without_taking_a_ticks_place(url: str) -> None:
    clock = Clock()
    app = make_app(url)
    s = Scheduler(app, clock=clock)
    await s.step()
    job_id = await trigger(app, "daily", "ops")
    info = await app.broker.get(job_id)
    assert info is not None
    m = info.message
    assert (m.args, m.key, m.headers["periodic"]["trigger"]) == (["daily"], None, True)
    assert await trigger(app, "daily") != job_id  # every trigger is a new run
    [daily] = [i for i in await list_schedules(app) if i.name == "daily"]
    assert daily.last_trigger is not None


async def test_admin_works_from_the_broker_alone(url: str) -> None:
    clock = Clock()
    app = make_app(url)
    s = Scheduler(app, clock=clock)
    await s.step()
    clock.t = T0 + 10
    await s.step()
    bare = dw.App(url)  # no code: what --url sees
    infos = {i.name: i for i in await list_schedules(bare, T0 + 11)}
    daily = infos["daily"]
    assert (daily.expression, daily.tz, daily.in_code, daily.task) == (
        "0 3 * * *",
        "Asia/Taipei",
        False,
        app.schedules["daily"].task.name,
    )
    assert daily.next_run == datetime(2024, 1, 1, 19, tzinfo=UTC).timestamp()
    ping = next(i for n, i in infos.items() if n.endswith("ping"))
    assert ping.last_run == T0 + 10 and ping.next_run == T0 + 20
    job_id = await trigger(bare, "daily")
    info = await bare.broker.get(job_id)
    assert info is not None and info.message.args == ["daily"]
    with pytest.raises(dw.ConfigurationError, match="no schedule 'nope'"):
        await trigger(bare, "nope")


async def test_as_a_worker_service_ticks_are_enqueued_and_run(url: str) -> None:
    """``Worker(app, services=[Scheduler(app)])``: the real clock; the test waits
    for an event set by the task, not for time."""
    app = dw.App(url)
    ran = asyncio.Event()
    seen: list[str] = []

    @app.periodic(cron="* * * * * *")  # every second
    async def beat(ctx: dw.Context) -> None:
        seen.append(ctx.message.key or "")
        ran.set()

    w = dw.Worker(app, services=[Scheduler(app, lease=2)], queues=("default",))
    runner = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        w.stop()
        await asyncio.wait_for(runner, 10)
    assert seen and all(k.startswith(f"periodic:{beat.name}:") for k in seen)
    assert await app.broker.acquire(LOCK, "next", 5) is not None  # released on stop


async def test_state_written_by_the_leader_is_readable(url: str) -> None:
    clock = Clock()
    app = make_app(url)
    s = Scheduler(app, clock=clock)
    await s.step()
    stored = await app.broker.kv_get([state_key("daily")])
    assert b'"expression":"0 3 * * *"' in stored[state_key("daily")]


async def test_a_failing_broker_is_retried_not_fatal(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Broker errors must not end the loop: as a worker's service, a crash would
    stop the worker.  The traceback is logged once."""
    app = make_app(url)
    s = Scheduler(app, lease=5, poll=0.01)
    real = app.broker.acquire
    calls = 0
    led = asyncio.Event()

    async def flaky(name: str, owner: str, ttl: float) -> int | None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise ConnectionError("broker down")
        token = await real(name, owner, ttl)
        led.set()
        return token

    app.broker.acquire = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, "dumbwaiter.scheduler"):
        runner = asyncio.create_task(s.run())
        await asyncio.wait_for(led.wait(), 10)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert sum(1 for r in caplog.records if r.exc_info) == 1
    assert any("work again after 3 failures" in r.getMessage() for r in caplog.records)
    assert s.token is None  # released on the way out
    assert await real(LOCK, "next", 5) is not None


def test_a_grace_period_shorter_than_a_failover_is_warned_about(url: str) -> None:
    app = dw.App(url)

    @app.periodic(every=60, grace=5)
    def job() -> None: ...

    [warning] = Scheduler(app, lease=15).check()
    assert "grace period (5s) is shorter than a failover (lease 15s + poll 1s)" in warning
    assert Scheduler(app, lease=3).check() == []


async def test_a_replica_without_schedules_stays_out_of_the_election(url: str) -> None:
    """A worker --with-scheduler of an app without schedules (another service on
    the same broker, an old deploy) must never hold the lease the others need."""
    empty = Scheduler(dw.App(url), clock=Clock())
    await empty.step()
    assert empty.token is None
    real = Scheduler(make_app(url), clock=Clock())
    await real.step()
    assert real.is_leader


def test_the_lock_lasts_one_lease_less_one_poll() -> None:
    """Expiry plus one follower poll fits in the lease: that is the takeover bound."""
    s = Scheduler(dw.App("memory://"), lease=15)
    assert (s.poll, s.ttl, s.renew) == (1.0, 14.0, 5.0)
    short = Scheduler(dw.App("memory://"), lease=3)
    assert short.ttl + short.poll == 3 and short.renew < short.ttl
    with pytest.raises(dw.ConfigurationError, match="poll"):
        Scheduler(dw.App("memory://"), lease=2, poll=2)
    with pytest.raises(dw.ConfigurationError, match="renew"):
        Scheduler(dw.App("memory://"), lease=3, renew=2.9)
