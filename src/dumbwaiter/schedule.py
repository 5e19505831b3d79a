"""Periodic schedules: what runs when (``@app.periodic``).

This module is pure: it knows the timetables (cron and fixed intervals),
the missed-tick policies and the tick keys, and it never talks to a broker.
``scheduler.py`` is the leader loop that turns plans into jobs.

Every time is epoch seconds (UTC), and every tick is a whole second, so two
replicas that compute the ticks of one schedule always get the same numbers,
and the same key ``periodic:NAME:TICK`` for each: that key is what makes a
tick run once however many schedulers think they are the leader.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import keys
from .errors import ConfigurationError, DumbwaiterError
from .message import Message, encode_checked
from .task import SendOptions, Task

if TYPE_CHECKING:
    from .ports import Runtime

Policy = Literal["skip", "once", "all"]
POLICIES: tuple[Policy, ...] = ("skip", "once", "all")

#: seconds a tick may be late and still count as on time (see ``Schedule.plan``).
#: It must be longer than a leader failover (one lease), so ticks that fall
#: while a new leader takes over run late rather than being "missed".
DEFAULT_GRACE = 60.0
#: most missed ticks ``missed="all"`` runs after an outage (the newest ones)
DEFAULT_CATCH_UP = 100
#: most on-time ticks of one schedule enqueued in one pass; the rest go in the next
MAX_TICKS_PER_PASS = 1000
#: missed ticks are counted (for the log) up to this many
COUNT_LIMIT = 10_000

#: the key prefix of every tick's job
KEY_PREFIX = keys.PERIODIC


def tick_label(t: float) -> str:
    """A tick as it appears in keys and logs: ``2024-05-01T03:00:00Z`` (UTC)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_key(name: str, t: float) -> str:
    """The uniqueness key of one tick of schedule ``name``."""
    return f"{KEY_PREFIX}{name}:{tick_label(t)}"


def zone(tz: str | tzinfo | None) -> tuple[tzinfo, str]:
    """The time zone and its IANA name; unknown names fail here, at declaration."""
    if tz is None:
        return UTC, "UTC"
    if isinstance(tz, ZoneInfo):
        return tz, tz.key
    if isinstance(tz, tzinfo):
        if tz.utcoffset(None) == timedelta(0):
            return UTC, "UTC"
        raise ConfigurationError(
            f"tz={tz!r}: pass an IANA time zone name such as 'Asia/Taipei' (or a ZoneInfo), "
            "so daylight-saving changes are known"
        )
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz), tz
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Paris' or "
            "'Asia/Taipei' (on a system without time zone data, pip install tzdata)"
        ) from None


# -- timetables --------------------------------------------------------------------


class Timetable(abc.ABC):
    """When a schedule fires: an ordered set of whole-second instants."""

    #: as shown by ``dumbwaiter schedules ls``
    expression: str
    #: IANA name of the zone the expression is read in
    tz: str

    @abc.abstractmethod
    def next_after(self, t: float) -> float:
        """The first tick strictly after ``t``."""

    @abc.abstractmethod
    def latest_at_or_before(self, t: float) -> float:
        """The last tick at or before ``t``."""

    def count(self, after: float, upto: float, limit: int) -> int:
        """Ticks in ``(after, upto]``; a timetable that must walk them to count
        stops at ``limit``."""
        n, t = 0, self.next_after(after)
        while t <= upto and n < limit:
            n += 1
            t = self.next_after(t)
        return n

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """What the broker keeps, so admin commands without the code can rebuild it."""

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Timetable:
        if d.get("every") is not None:
            return Every(int(d["every"]))
        return Cron(str(d["cron"]), str(d.get("tz") or "UTC"), str(d.get("hash_id") or ""))


class Cron(Timetable):
    """A cron expression read in a time zone, by croniter.

    Five fields (minute hour day month weekday), or six with seconds as the
    sixth, croniter's convention; ``@daily`` and friends; ``H`` spreads a
    field by a hash of the schedule's name.  Daylight-saving changes are
    handled as croniter defines (docs/scheduler.md): a wall-clock time that
    does not exist (spring forward) fires at the first time after the gap,
    and one that happens twice (fall back) fires twice, once per instant.
    """

    def __init__(self, expr: str, tz: str | tzinfo | None = None, hash_id: str = "") -> None:
        from croniter import (  # type: ignore[import-untyped]  # imported on first use: start-up
            CroniterBadCronError,
            CroniterBadDateError,
            croniter,
        )

        if not isinstance(expr, str) or not expr.strip():
            raise ConfigurationError(f"cron= must be a cron expression string, got {expr!r}")
        self.expression = " ".join(expr.split())
        self.zone, self.tz = zone(tz)
        self.hash_id = hash_id
        start = datetime.now(self.zone)
        try:
            self._iter = croniter(self.expression, start, hash_id=hash_id.encode() or None)
            self._iter.get_next(float)  # an expression that never fires (Feb 30) fails here
        except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError) as exc:
            raise ConfigurationError(
                f"invalid cron expression {expr!r}: {exc} (five fields: minute hour "
                "day-of-month month day-of-week, or six with seconds last)"
            ) from None

    def next_after(self, t: float) -> float:
        return float(self._iter.get_next(float, start_time=datetime.fromtimestamp(t, self.zone)))

    def latest_at_or_before(self, t: float) -> float:
        # croniter's get_prev is strictly before its start; ticks are whole
        # seconds, so "at or before t" is "before floor(t) + 0.5"
        start = datetime.fromtimestamp(math.floor(t) + 0.5, self.zone)
        return float(self._iter.get_prev(float, start_time=start))

    def to_dict(self) -> dict[str, Any]:
        return {"cron": self.expression, "tz": self.tz, "hash_id": self.hash_id}


class Every(Timetable):
    """A fixed interval, aligned to the Unix epoch: ``every=timedelta(minutes=5)``
    fires at :00, :05, :10... UTC, whichever replica computes it and whenever
    it started.  Intervals count real seconds, so time zones do not apply."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.expression = f"every {_duration(seconds)}"
        self.tz = "UTC"

    def next_after(self, t: float) -> float:
        return float((math.floor(t / self.seconds) + 1) * self.seconds)

    def latest_at_or_before(self, t: float) -> float:
        return float(math.floor(t / self.seconds) * self.seconds)

    def count(self, after: float, upto: float, limit: int) -> int:
        if upto <= after:
            return 0
        return max(0, math.floor(upto / self.seconds) - math.floor(after / self.seconds))

    def to_dict(self) -> dict[str, Any]:
        return {"every": self.seconds, "tz": self.tz}


def _every_seconds(every: timedelta | float | int) -> int:
    if isinstance(every, timedelta):
        s = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        s = float(every)
    else:
        raise ConfigurationError(f"every= takes a timedelta or seconds, got {every!r}")
    if s < 1 or s != int(s):
        raise ConfigurationError(
            f"every={every!r}: the interval must be a whole number of seconds, at least 1"
        )
    return int(s)


def _duration(seconds: int) -> str:
    """``90`` -> ``1m30s``; ``86400`` -> ``1d``."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


# -- plans -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What one pass does with one schedule: pure arithmetic over ticks."""

    #: ticks to enqueue, oldest first (catch-ups included)
    run: tuple[float, ...]
    #: every tick at or before this has been decided (the schedule's new mark)
    through: float
    #: of ``run``, the ticks older than the grace period (run by ``once``/``all``)
    caught_up: tuple[float, ...] = ()
    #: missed ticks not run (for cron, counted up to ``COUNT_LIMIT``)
    skipped: int = 0
    #: the oldest and newest of the missed ticks, for the log
    missed_from: float | None = None
    missed_to: float | None = None

    @property
    def missed(self) -> bool:
        return self.missed_from is not None


# -- schedules ---------------------------------------------------------------------


class Schedule:
    """One periodic schedule: a task, its arguments, a timetable and a policy."""

    def __init__(
        self,
        name: str,
        task: Task,
        timetable: Timetable,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: Policy = "skip",
        catch_up: int = DEFAULT_CATCH_UP,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        self.name = name
        self.task = task
        self.timetable = timetable
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.missed = missed
        self.catch_up = catch_up
        self.grace = grace

    def __repr__(self) -> str:
        return f"<Schedule {self.name} {self.timetable.expression} tz={self.timetable.tz}>"

    @property
    def expression(self) -> str:
        return self.timetable.expression

    @property
    def tz(self) -> str:
        return self.timetable.tz

    def key(self, tick: float) -> str:
        return tick_key(self.name, tick)

    def next_after(self, t: float) -> float:
        return self.timetable.next_after(t)

    def plan(self, through: float, now: float, *, limit: int = MAX_TICKS_PER_PASS) -> Plan:
        """Decide the ticks in ``(through, now]``.

        A tick at most ``grace`` seconds old is on time and runs (late, if a
        leader failover delayed it).  Older ticks were *missed* (every
        scheduler was down, or the schedule was paused without one running):
        ``skip`` runs none of them, ``once`` runs the newest, ``all`` runs the
        newest ``catch_up`` of them.  At most ``limit`` on-time ticks are
        planned; the mark then stops at the last one, and the next pass goes on.
        """
        tt = self.timetable
        if now <= through:
            return Plan(run=(), through=through)
        cut = now - self.grace
        caught: list[float] = []
        skipped = 0
        missed_from = missed_to = None
        start = through
        if through < cut:
            first = tt.next_after(through)
            if first <= cut:
                missed_from, missed_to = first, tt.latest_at_or_before(cut)
                total = tt.count(through, cut, COUNT_LIMIT)
                if self.missed == "once":
                    caught = [missed_to]
                elif self.missed == "all":
                    t = missed_to
                    while t > through and len(caught) < self.catch_up:
                        caught.append(t)
                        t = tt.latest_at_or_before(t - 1)
                    caught.reverse()
                skipped = max(0, total - len(caught))
            start = cut
        run = list(caught)
        t = tt.next_after(start)
        on_time = 0
        while t <= now and on_time < limit:
            run.append(t)
            on_time += 1
            t = tt.next_after(t)
        mark = run[-1] if on_time == limit and t <= now else now
        return Plan(
            run=tuple(run),
            through=mark,
            caught_up=tuple(caught),
            skipped=skipped,
            missed_from=missed_from,
            missed_to=missed_to,
        )

    def message(self, tick: float | None, now: float, by: str) -> Message:
        """The job of one tick (``tick=None``: a manual trigger, with no key)."""
        header: dict[str, Any] = {"schedule": self.name, "by": by}
        if tick is None:
            header["trigger"] = True
        else:
            header["tick"] = tick_label(tick)
        opts = SendOptions.make(
            key=None if tick is None else self.key(tick), headers={"periodic": header}
        )
        return self.task.message(self.args, self.kwargs, opts, now)

    def to_dict(self) -> dict[str, Any]:
        """The definition kept beside the schedule's state in the broker, so
        ``dumbwaiter schedules`` works from a bare ``--url``."""
        return {
            "schedule": self.name,
            "task": self.task.name,
            "queue": self.task.queue,
            "priority": self.task.priority,
            "max_attempts": self.task.retry.attempts,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "expression": self.expression,
            "missed": self.missed,
            **self.timetable.to_dict(),
        }


# -- declaring -----------------------------------------------------------------------


def declare(
    app: Runtime,
    schedules: dict[str, Schedule],
    new_task: Callable[[Callable[..., Any]], Task[..., Any]],
    *,
    cron: str | None = None,
    every: timedelta | float | None = None,
    tz: str | tzinfo | None = None,
    name: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    missed: Policy = "skip",
    catch_up: int | None = None,
    grace: timedelta | float | None = None,
    task_options: Mapping[str, Any] | None = None,
) -> Callable[[Any], Task]:
    """``App.periodic``: check everything that can be checked now, and return the
    decorator that registers the schedule in ``schedules`` (and, for a plain
    function, the task ``new_task`` makes of it)."""
    interval, catch_up, grace_s = _check(cron, every, tz, missed, catch_up, grace, args, kwargs)
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(f"schedule name must be a non-empty string, got {name!r}")

    def register(target: Any) -> Task:
        if isinstance(target, Task):
            if task_options:
                raise ConfigurationError(
                    f"task options {sorted(task_options)} belong on @app.task; "
                    f"{target.name} is already registered"
                )
            if target.app is not app:
                raise ConfigurationError(f"task {target.name} belongs to another App")
            task = target
        else:
            task = new_task(target)
        sname = name or task.name
        if sname in schedules:
            raise ConfigurationError(
                f"two schedules are named {sname!r}; give the second one name= "
                "(a task scheduled twice, with other arguments, needs one per schedule)"
            )
        timetable: Timetable = Every(interval) if every is not None else Cron(cron or "", tz, sname)
        schedule = Schedule(
            sname,
            task,
            timetable,
            args=args,
            kwargs=kwargs,
            missed=missed,
            catch_up=catch_up,
            grace=grace_s,
        )
        try:  # a tick's job as the leader will build it: arguments, JSON, size
            encode_checked(schedule.message(0.0, 0.0, ""), app.max_message_size)
        except DumbwaiterError as exc:
            raise ConfigurationError(f"schedule {sname}: {exc}") from None
        schedules[sname] = schedule
        return task

    if cron is not None:  # an invalid expression or zone fails at the decorator's call
        Cron(cron, tz, name or "declare")
    return register


def _check(
    cron: str | None,
    every: timedelta | float | None,
    tz: str | tzinfo | None,
    missed: str,
    catch_up: int | None,
    grace: timedelta | float | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
) -> tuple[int, int, float]:
    """Validate the options of ``@app.periodic``; return the interval (0 for
    cron), the catch-up bound and the grace period in seconds."""
    if (cron is None) == (every is None):
        raise ConfigurationError("@app.periodic needs cron= or every= (exactly one)")
    if missed not in POLICIES:
        raise ConfigurationError(f"missed={missed!r}: choose one of {', '.join(POLICIES)}")
    if catch_up is None:
        catch_up = DEFAULT_CATCH_UP
    if not isinstance(catch_up, int) or isinstance(catch_up, bool) or catch_up < 1:
        raise ConfigurationError(f"catch_up must be a positive integer, got {catch_up!r}")
    grace_s = DEFAULT_GRACE if grace is None else _positive(grace, "grace")
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"args= takes a tuple or list, got {args!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"kwargs= takes a dict, got {kwargs!r}")
    if every is None:
        return 0, catch_up, grace_s
    if tz is not None:
        raise ConfigurationError(
            "tz= applies to cron= only: every= counts real seconds from the Unix epoch; "
            "for wall-clock times use cron= with tz="
        )
    return _every_seconds(every), catch_up, grace_s


def _positive(value: timedelta | float, what: str) -> float:
    if isinstance(value, timedelta):
        s = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        s = float(value)
    else:
        raise ConfigurationError(f"{what} takes a timedelta or seconds, got {value!r}")
    if s <= 0:
        raise ConfigurationError(f"{what} must be positive, got {value!r}")
    return s
