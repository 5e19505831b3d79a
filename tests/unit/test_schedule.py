"""Schedules without a broker: timetables, DST, missed-tick policies, declaration errors.

Every time here is computed, none is waited for: ``Schedule.plan(through,
now)`` is pure arithmetic over ticks, so an outage of a month is one call.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import dumbwaiter as dw
from dumbwaiter.schedule import (
    DEFAULT_GRACE,
    Cron,
    Every,
    Schedule,
    Timetable,
    tick_key,
    tick_label,
)

NY = ZoneInfo("America/New_York")


def at(*parts: int, tz: ZoneInfo | None = None, fold: int = 0) -> float:
    """Epoch seconds of a wall-clock time (UTC unless ``tz``)."""
    return datetime(*parts, tzinfo=tz or UTC, fold=fold).timestamp()  # type: ignore[arg-type, misc]


def ticks(tt: Timetable, start: float, n: int) -> list[float]:
    out, t = [], start
    for _ in range(n):
        t = tt.next_after(t)
        out.append(t)
    return out


def local(ts: list[float], tz: ZoneInfo = NY) -> list[str]:
    return [datetime.fromtimestamp(t, tz).isoformat() for t in ts]


@pytest.fixture
def app() -> dw.App:
    return dw.App("memory://")


# -- timetables ---------------------------------------------------------------------


def test_cron_in_a_time_zone_fires_at_local_wall_clock_time() -> None:
    tt = Cron("0 3 * * *", "Asia/Taipei")
    first = tt.next_after(at(2024, 5, 1))
    assert tick_label(first) == "2024-05-01T19:00:00Z"  # 03:00 in Taipei (UTC+8)
    assert (tt.expression, tt.tz) == ("0 3 * * *", "Asia/Taipei")


def test_cron_seconds_are_the_sixth_field() -> None:
    tt = Cron("* * * * * */15")
    assert [int(t - at(2024, 1, 1)) for t in ticks(tt, at(2024, 1, 1), 4)] == [15, 30, 45, 60]


def test_next_after_is_strict_and_latest_at_or_before_is_inclusive() -> None:
    for tt in (Cron("0 * * * *"), Every(3600)):
        t = at(2024, 1, 1, 3)
        assert tt.next_after(t) == at(2024, 1, 1, 4)
        assert tt.next_after(t - 0.5) == t
        assert tt.latest_at_or_before(t) == t
        assert tt.latest_at_or_before(t + 0.5) == t
        assert tt.latest_at_or_before(t - 0.5) == at(2024, 1, 1, 2)


def test_every_is_aligned_to_the_epoch_whatever_the_start() -> None:
    tt = Every(300)
    assert tt.next_after(at(2024, 1, 1, 10, 2, 17)) == at(2024, 1, 1, 10, 5)
    assert tt.expression == "every 5m"
    assert Every(90).expression == "every 1m30s"
    assert Every(86400).expression == "every 1d"


def test_count_is_exact_for_intervals_and_bounded_for_cron() -> None:
    assert Every(1).count(at(2024, 1, 1), at(2024, 1, 2), 10**9) == 86400
    assert Cron("* * * * *").count(at(2024, 1, 1), at(2024, 1, 2), 100) == 100


def test_hashed_fields_spread_by_schedule_name() -> None:
    a, b = Cron("H 3 * * *", None, "a.report"), Cron("H 3 * * *", None, "b.report")
    ta, tb = a.next_after(at(2024, 1, 1)), b.next_after(at(2024, 1, 1))
    assert datetime.fromtimestamp(ta, UTC).hour == 3 and ta != tb  # same hour, other minute
    assert Cron("H 3 * * *", None, "a.report").next_after(at(2024, 1, 1)) == ta  # stable


def test_timetable_round_trips_through_its_stored_form() -> None:
    for tt in (Cron("30 2 * * 1-5", "Europe/Paris", "x"), Every(45)):
        again = Timetable.from_dict(tt.to_dict())
        assert again.expression == tt.expression and again.tz == tt.tz
        assert ticks(again, at(2024, 3, 1), 5) == ticks(tt, at(2024, 3, 1), 5)


def test_tick_keys_name_the_schedule_and_the_utc_instant() -> None:
    assert tick_key("nightly", at(2024, 5, 1, 3)) == "periodic:nightly:2024-05-01T03:00:00Z"


# -- daylight saving (as croniter defines it) ----------------------------------------


def test_spring_forward_a_time_in_the_gap_runs_once_at_the_end_of_the_gap() -> None:
    # 2024-03-10 in New York: 02:00 EST jumps to 03:00 EDT; 02:30 never happens
    tt = Cron("30 2 * * *", "America/New_York")
    assert local(ticks(tt, at(2024, 3, 8, 12, tz=NY), 4)) == [
        "2024-03-09T02:30:00-05:00",
        "2024-03-10T03:00:00-04:00",  # the day without 02:30: once, at 03:00
        "2024-03-11T02:30:00-04:00",
        "2024-03-12T02:30:00-04:00",
    ]


def test_fall_back_a_time_in_the_repeated_hour_runs_at_both_instants() -> None:
    # 2024-11-03 in New York: 01:00-02:00 happens twice (EDT, then EST)
    tt = Cron("30 1 * * *", "America/New_York")
    got = ticks(tt, at(2024, 11, 2, 12, tz=NY), 3)
    assert local(got) == [
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:30:00-05:00",  # the same wall-clock time, one hour later
        "2024-11-04T01:30:00-05:00",
    ]
    assert got[1] - got[0] == 3600
    assert len({tick_key("s", t) for t in got}) == 3  # two distinct ticks, two distinct keys


def test_hourly_schedules_keep_real_hours_across_both_transitions() -> None:
    tt = Cron("0 * * * *", "America/New_York")
    spring = ticks(tt, at(2024, 3, 10, 0, 30, tz=NY), 3)
    fall = ticks(tt, at(2024, 11, 3, 0, 30, tz=NY), 4)
    assert [b - a for a, b in itertools.pairwise(spring)] == [3600, 3600]
    assert [b - a for a, b in itertools.pairwise(fall)] == [3600, 3600, 3600]
    assert local(fall)[:2] == ["2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00"]


def test_utc_schedules_never_shift() -> None:
    tt = Cron("30 1 * * *")
    got = ticks(tt, at(2024, 11, 2, 12), 3)
    assert [b - a for a, b in itertools.pairwise(got)] == [86400, 86400]


# -- missed-tick policies -----------------------------------------------------------


def schedule(app: dw.App, missed: str = "skip", every: int = 60, **kw: object) -> Schedule:
    @app.periodic(every=timedelta(seconds=every), missed=missed, **kw)  # type: ignore[arg-type]
    def job() -> None: ...

    return app.schedules[job.name]


T0 = at(2024, 1, 1)


def test_on_time_ticks_run_and_the_mark_moves_to_now(app: dw.App) -> None:
    s = schedule(app, every=10)
    p = s.plan(T0, T0 + 35)
    assert p.run == (T0 + 10, T0 + 20, T0 + 30) and p.through == T0 + 35
    assert not p.missed and p.skipped == 0
    assert s.plan(p.through, T0 + 39).run == ()
    assert s.plan(p.through, T0 + 40).run == (T0 + 40,)


def test_late_ticks_within_the_grace_period_are_not_missed(app: dw.App) -> None:
    # a failover: the new leader comes 40 s after the tick; it still runs, late
    s = schedule(app, every=10)
    p = s.plan(T0, T0 + 40)
    assert p.run == (T0 + 10, T0 + 20, T0 + 30, T0 + 40) and not p.missed


def test_skip_runs_none_of_the_missed_ticks(app: dw.App) -> None:
    s = schedule(app, "skip")
    now = T0 + 3600 * 5 + 30
    p = s.plan(T0, now)
    assert p.missed and p.caught_up == ()
    assert p.run == (T0 + 3600 * 5,)  # only the one inside the grace period
    assert p.missed_from == T0 + 60 and p.missed_to == T0 + 3600 * 5 - 60
    assert p.skipped == 5 * 60 - 1
    assert s.plan(p.through, now + 30).run == (T0 + 3600 * 5 + 60,)  # then on schedule


def test_once_runs_the_newest_missed_tick_once(app: dw.App) -> None:
    s = schedule(app, "once")
    now = T0 + 3600 * 5 + 30
    p = s.plan(T0, now)
    assert p.caught_up == (T0 + 3600 * 5 - 60,)
    assert p.run == (T0 + 3600 * 5 - 60, T0 + 3600 * 5)
    assert p.skipped == 5 * 60 - 2
    assert s.plan(p.through, now + 10).run == ()  # no second catch-up


def test_all_runs_every_missed_tick_up_to_its_bound_newest_first_kept(app: dw.App) -> None:
    s = schedule(app, "all", catch_up=5)
    now = T0 + 3600 + 30
    p = s.plan(T0, now)
    assert p.caught_up == tuple(T0 + 3600 - 60 * i for i in range(5, 0, -1))
    assert p.run == (*p.caught_up, T0 + 3600)
    assert p.skipped == 59 - 5
    small = schedule(app, "all", name="small", catch_up=100)
    q = small.plan(T0, T0 + 300 + 10)  # four missed, one on time: all run, in order
    assert q.run == (T0 + 60, T0 + 120, T0 + 180, T0 + 240, T0 + 300)
    assert q.caught_up == q.run[:4] and q.skipped == 0


def test_a_month_long_outage_is_planned_without_walking_every_tick(app: dw.App) -> None:
    s = schedule(app, "skip", every=1)
    p = s.plan(T0, T0 + 30 * 86400)
    assert len(p.run) == DEFAULT_GRACE  # the on-time window only
    assert p.skipped == 30 * 86400 - int(DEFAULT_GRACE)


def test_a_custom_grace_period(app: dw.App) -> None:
    s = schedule(app, "skip", every=60, grace=timedelta(hours=2))
    assert len(s.plan(T0, T0 + 3600).run) == 60 and not s.plan(T0, T0 + 3600).missed


def test_plans_stop_at_the_limit_and_go_on_from_there(app: dw.App) -> None:
    s = schedule(app, every=1, grace=10_000)
    p = s.plan(T0, T0 + 5000, limit=1000)
    assert len(p.run) == 1000 and p.through == p.run[-1] == T0 + 1000
    q = s.plan(p.through, T0 + 5000, limit=1000)
    assert q.run[0] == T0 + 1001


def test_a_clock_that_went_back_plans_nothing(app: dw.App) -> None:
    s = schedule(app)
    p = s.plan(T0 + 100, T0 + 50)
    assert p.run == () and p.through == T0 + 100


def test_cron_policies_count_across_dst(app: dw.App) -> None:
    @app.periodic(cron="30 1 * * *", tz="America/New_York", missed="all")
    def nightly() -> None: ...

    s = app.schedules[nightly.name]
    p = s.plan(at(2024, 11, 1, 12, tz=NY), at(2024, 11, 4, 12, tz=NY))
    assert local(list(p.caught_up)) == [
        "2024-11-02T01:30:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:30:00-05:00",
        "2024-11-04T01:30:00-05:00",
    ]


# -- declaring -------------------------------------------------------------------------


def test_decorating_a_new_function_registers_the_task_and_the_schedule(app: dw.App) -> None:
    @app.periodic(cron="0 3 * * *", tz="Asia/Taipei", queue="reports")
    def nightly_report() -> None: ...

    assert isinstance(nightly_report, dw.Task)
    assert app.tasks[nightly_report.name] is nightly_report and nightly_report.queue == "reports"
    s = app.schedules[nightly_report.name]
    assert (s.expression, s.tz, s.missed, s.task) == (
        "0 3 * * *",
        "Asia/Taipei",
        "skip",
        nightly_report,
    )


def test_an_existing_task_scheduled_twice_with_arguments(app: dw.App) -> None:
    @app.task
    def report(kind: str, *, days: int = 1) -> None: ...

    app.periodic(cron="0 3 * * *", args=("daily",), name="daily")(report)
    app.periodic(cron="0 4 * * 1", args=("weekly",), kwargs={"days": 7}, name="weekly")(report)
    assert app.schedules["weekly"].kwargs == {"days": 7}
    m = app.schedules["weekly"].message(T0, T0, "me")
    assert (m.name, m.args, m.kwargs, m.key) == (
        report.name,
        ["weekly"],
        {"days": 7},
        "periodic:weekly:2024-01-01T00:00:00Z",
    )
    assert m.headers["periodic"] == {
        "schedule": "weekly",
        "tick": "2024-01-01T00:00:00Z",
        "by": "me",
    }


def test_stacked_on_app_task(app: dw.App) -> None:
    @app.periodic(every=timedelta(minutes=5))
    @app.task(queue="q")
    def tick() -> None: ...

    assert app.schedules[tick.name].task is tick and tick.queue == "q"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "every day"}, "invalid cron expression"),
        ({"cron": "0 0 30 2 *"}, "invalid cron expression '0 0 30 2 *'"),  # never fires
        ({"cron": "0 3 * * *", "tz": "Asia/Taipeh"}, "unknown time zone 'Asia/Taipeh'"),
        ({"cron": "0 3 * * *", "tz": 8}, "IANA time zone"),
        ({}, "needs cron= or every="),
        ({"cron": "* * * * *", "every": 60}, "needs cron= or every="),
        ({"every": timedelta(milliseconds=1500)}, "whole number of seconds"),
        ({"every": 0}, "whole number of seconds, at least 1"),
        ({"every": 60, "tz": "Europe/Paris"}, "tz= applies to cron= only"),
        ({"every": 60, "missed": "twice"}, "missed='twice': choose one of skip, once, all"),
        ({"every": 60, "catch_up": 0}, "catch_up must be a positive integer"),
        ({"every": 60, "grace": -1}, "grace must be positive"),
    ],
)
def test_bad_declarations_fail_at_the_decorator_call(
    app: dw.App, options: dict[str, object], message: str
) -> None:
    with pytest.raises(dw.ConfigurationError, match=re.escape(message)):
        app.periodic(**options)  # type: ignore[arg-type]
    assert not app.schedules


def test_arguments_that_do_not_fit_fail_at_declaration(app: dw.App) -> None:
    @app.task
    def report(kind: str) -> None: ...

    with pytest.raises(dw.ConfigurationError, match="missing a required argument: 'kind'"):
        app.periodic(every=60)(report)
    with pytest.raises(dw.ConfigurationError, match="JSON"):
        app.periodic(every=60, args=(object(),))(report)


def test_two_schedules_with_one_name_fail(app: dw.App) -> None:
    @app.periodic(every=60)
    def job() -> None: ...

    with pytest.raises(dw.ConfigurationError, match="two schedules are named"):
        app.periodic(every=120)(job)
    app.periodic(every=120, name="job-slow")(job)  # a name of its own is fine


def test_task_options_on_an_existing_task_fail(app: dw.App) -> None:
    @app.task
    def job() -> None: ...

    with pytest.raises(dw.ConfigurationError, match=r"belong on @app\.task"):
        app.periodic(every=60, queue="other")(job)
    other = dw.App("memory://")
    with pytest.raises(dw.ConfigurationError, match="another App"):
        other.periodic(every=60)(job)


def test_apps_do_not_share_schedules() -> None:
    a, b = dw.App("memory://"), dw.App("memory://")

    @a.periodic(every=60)
    def job() -> None: ...

    assert list(a.schedules) == [job.name] and b.schedules == {}


def test_arguments_over_the_size_limit_fail_at_declaration() -> None:
    app = dw.App("memory://", max_message_size=1024)

    @app.task
    def store(blob: str) -> None: ...

    with pytest.raises(dw.ConfigurationError, match=r"schedule big: .* over the maximum of 1,024"):
        app.periodic(every=60, args=("x" * 2000,), name="big")(store)
    assert "big" not in app.schedules
