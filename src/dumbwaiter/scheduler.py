"""The scheduler: one leader among any number of replicas enqueues the ticks.

Every replica (``dumbwaiter scheduler``, or ``dumbwaiter worker
--with-scheduler``) runs the same loop.  One of them holds the leader lease
(the broker's ``acquire``/``renew``, with a fencing token) and renews it
every third of the lease while it lives; the others try to take it every
``poll`` seconds.  The broker's lock lasts one lease less one poll, so a new
leader takes over within one lease after the old one dies, and within a poll
after one stops cleanly (it releases).  A replica whose app has no schedules
stays out of the election.

Leadership is an optimisation, not the guarantee.  Each tick is enqueued with
the key ``periodic:NAME:TICK``, which the broker stores once while the job is
kept, so two leaders at once (a paused process that wakes up, a partition)
enqueue each tick once between them.  The leader also stops acting as soon as
its lease may have run out by its own monotonic clock, and steps down when it
reads state written under a newer fencing token.

What the leader keeps in the broker's key-value store, per schedule:

* ``dumbwaiter:schedule:NAME``: the definition (so ``dumbwaiter schedules``
  works from a bare URL), the mark ``through`` (every tick up to it has been
  decided), the last tick enqueued and its job, the next tick, and the token
  of the leader that wrote it;
* ``dumbwaiter:schedule-paused:NAME``: present while paused (written by
  ``dumbwaiter schedules pause``; no TTL, so it holds across restarts).

The leader enqueues first and writes the mark after, so a leader that dies
in between only makes its successor enqueue the same ticks again, which the
keys turn into no-ops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from . import keys
from .errors import ConfigurationError
from .message import TASK, Message, uuid7
from .schedule import Plan, Schedule, Timetable, tick_label
from .worker_config import default_worker_id

if TYPE_CHECKING:
    from .app import App
    from .brokers.base import Broker
    from .worker import Worker

log = logging.getLogger("dumbwaiter.scheduler")

#: the leader lease's name in the broker's coordination part
LOCK = keys.SCHEDULER_LOCK
STATE_PREFIX = keys.SCHEDULE
PAUSED_PREFIX = keys.SCHEDULE_PAUSED
TRIGGER_PREFIX = keys.SCHEDULE_TRIGGER

#: seconds the leader lease lasts without a renewal
DEFAULT_LEASE = 15.0


def state_key(name: str) -> str:
    return STATE_PREFIX + name


def paused_key(name: str) -> str:
    return PAUSED_PREFIX + name


def trigger_key(name: str) -> str:
    return TRIGGER_PREFIX + name


def _load(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _number(d: dict[str, Any] | None, key: str) -> float | None:
    value = None if d is None else d.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(slots=True)
class Decision:
    """What one pass decided for one schedule (logged, and returned for tests)."""

    schedule: str
    plan: Plan
    policy: str = "skip"
    paused: bool = False
    #: tick -> id of the job enqueued for it
    enqueued: dict[float, str] = field(default_factory=dict)
    #: ticks whose key was already held: enqueued before, by this or another leader
    duplicates: list[float] = field(default_factory=list)


class Scheduler:
    """Run ``app.schedules``: ``await Scheduler(app).run()`` until cancelled, or
    pass it to ``Worker(app, services=[Scheduler(app)])``.

    ``clock`` (wall time of the schedules) is injectable for tests; lease
    validity is always measured on the monotonic clock, which no NTP step moves.
    """

    def __init__(
        self,
        app: App,
        *,
        lease: float = DEFAULT_LEASE,
        renew: float | None = None,
        poll: float | None = None,
        owner: str | None = None,
        lock: str = LOCK,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease <= 0:
            raise ConfigurationError(f"the scheduler's lease must be positive, got {lease}")
        self.app = app
        self.broker: Broker = app.broker
        #: the takeover bound: a dead leader is replaced within this many seconds
        self.lease = lease
        #: how often a follower tries to take the lease
        self.poll = poll if poll is not None else min(1.0, lease / 5)
        if not 0 < self.poll < lease:
            raise ConfigurationError(f"poll ({self.poll} s) must be shorter than the lease")
        #: what the broker's lock lasts: expiry plus one follower poll fits in ``lease``
        self.ttl = lease - self.poll
        self.renew = renew if renew is not None else lease / 3
        if not 0 < self.renew < self.ttl:
            raise ConfigurationError(
                f"renew ({self.renew} s) must be shorter than the lease less one poll "
                f"({self.ttl} s)"
            )
        self.owner = owner
        self.lock = lock
        self.clock = clock
        #: fencing token while leader, else None
        self.token: int | None = None
        self._valid_until = 0.0  # monotonic time the lease surely holds until
        self._renew_at = 0.0
        self._through: dict[str, float] = {}  # this process's own marks (never go back)
        self._next: dict[str, float] = {}

    @property
    def schedules(self) -> list[Schedule]:
        return list(self.app.schedules.values())

    @property
    def is_leader(self) -> bool:
        return self.token is not None and time.monotonic() < self._valid_until

    # -- as a worker's side service ------------------------------------------------

    async def __call__(self, worker: Worker) -> None:
        if self.owner is None:
            self.owner = worker.id
        await self.run()

    def check(self) -> list[str]:
        """Settings that work against each other (logged when the loop starts)."""
        return [
            f"schedule {s.name}: its grace period ({s.grace:g}s) is shorter than a failover "
            f"(lease {self.lease:g}s + poll {self.poll:g}s); ticks that fall during one count "
            "as missed"
            for s in self.schedules
            if s.grace < self.lease + self.poll
        ]

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Take part in the election and, while leader, enqueue ticks; until cancelled."""
        if self.owner is None:
            self.owner = default_worker_id()
        await self.broker.open()
        names = ", ".join(sorted(self.app.schedules)) or "none"
        log.info(
            "scheduler %s started (lease %.1fs); schedules: %s",
            self.owner,
            self.lease,
            names,
            extra={"action": "scheduler_start"},
        )
        for warning in self.check():
            log.warning("%s", warning)
        failing = 0
        try:
            while True:
                try:
                    delay = await self.step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # the broker is down or flaky: keep trying (a crash would stop a
                    # worker running this as a service); the traceback once, then a line
                    failing += 1
                    if failing == 1:
                        log.exception("scheduler pass failed; trying again every %.1fs", self.poll)
                    elif failing % 60 == 0:
                        log.warning(
                            "scheduler passes still failing (%d in a row): %r", failing, exc
                        )
                    delay = self.poll
                else:
                    if failing:
                        log.info("scheduler passes work again after %d failures", failing)
                    failing = 0
                await asyncio.sleep(delay)
        finally:
            await self.resign()

    async def step(self) -> float:
        """One pass: keep or seek the lease; as leader, enqueue what is due.
        Returns the seconds until the next pass is needed."""
        owner = self.owner or default_worker_id()
        self.owner = owner
        if not self.app.schedules:
            # nothing to run: stay out of the election, so a replica of an app
            # without schedules never holds the lease that one with them needs
            await self.resign()
            return self.renew
        started = time.monotonic()
        if self.token is not None and started >= self._valid_until:
            log.warning(
                "leader lease (token %d) ran out before it could be renewed; stepping down",
                self.token,
                extra={"action": "scheduler_lease_lost"},
            )
            self.token = None
        if self.token is None:
            token = await self.broker.acquire(self.lock, owner, self.ttl)
            if token is None:
                return self.poll
            self.token = token
            self._held(started)
            log.info(
                "scheduler %s is the leader (token %d)",
                owner,
                token,
                extra={"action": "scheduler_leader", "token": token},
            )
        elif started >= self._renew_at:
            if not await self.broker.renew(self.lock, owner, self.token, self.ttl):
                log.warning(
                    "scheduler %s lost the leader lease (token %d)",
                    owner,
                    self.token,
                    extra={"action": "scheduler_lease_lost"},
                )
                self.token = None
                return 0.0
            self._held(started)
        await self.run_due(self.clock())
        wait = min(self._next.values(), default=self.clock() + self.renew) - self.clock()
        return max(0.0, min(wait, self._renew_at - time.monotonic()))

    def _held(self, since: float) -> None:
        """The lease was granted or renewed by a call that started at ``since``."""
        self._valid_until = since + self.ttl
        self._renew_at = since + self.renew

    async def resign(self) -> None:
        """Give the lease up (on a clean stop), so a follower takes over at once."""
        token, self.token = self.token, None
        if token is None or self.owner is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.broker.release(self.lock, self.owner, token), 5.0)
            log.info(
                "scheduler %s released the leader lease", self.owner, extra={"action": "resign"}
            )

    # -- one leader pass ---------------------------------------------------------------

    async def run_due(self, now: float) -> list[Decision]:
        """Enqueue every tick due at ``now`` (the leader's work), and record it."""
        if self.token is None:
            return []
        token = self.token
        schedules = self.schedules
        keys = [k for s in schedules for k in (state_key(s.name), paused_key(s.name))]
        stored = await self.broker.kv_get(keys)
        if self._superseded(schedules, stored, token):
            self.token = None
            return []
        decisions: list[Decision] = []
        fresh: list[Schedule] = []
        for s in schedules:
            d = self._decide(s, stored, now)
            if d is None:
                fresh.append(s)
            else:
                decisions.append(d)
        if not await self._enqueue(decisions, now):
            return []
        updates = {state_key(s.name): self._record(s, token, now, None, stored) for s in fresh}
        for d in decisions:
            s = self.app.schedules[d.schedule]
            self._through[s.name] = d.plan.through
            self._next[s.name] = s.next_after(max(d.plan.through, now))
            if d.plan.run or d.plan.missed or d.plan.through != now:
                updates[state_key(s.name)] = self._record(s, token, now, d, stored)
            _log(d)
        if updates:
            await self.broker.kv_set(updates)
        return decisions

    def _superseded(self, schedules: list[Schedule], stored: dict[str, bytes], token: int) -> bool:
        """True if a leader with a newer fencing token wrote any schedule's state:
        this process's lease is gone, whatever it believes."""
        for s in schedules:
            newer = _number(_load(stored.get(state_key(s.name))), "token")
            if newer is not None and newer > token:
                log.warning(
                    "schedule %s was written by a newer leader (token %d > %d); stepping down",
                    s.name,
                    newer,
                    token,
                    extra={"action": "scheduler_superseded"},
                )
                return True
        return False

    def _decide(self, s: Schedule, stored: dict[str, bytes], now: float) -> Decision | None:
        """Plan one schedule; None the first time it is seen (it starts now: no
        tick before its first sight is owed)."""
        state = _load(stored.get(state_key(s.name)))
        marks = [self._through.get(s.name), _number(state, "through")]
        known = [m for m in marks if m is not None]
        if not known:
            self._through[s.name] = now
            self._next[s.name] = s.next_after(now)
            log.info(
                "schedule %s (%s, %s) starts; first tick %s",
                s.name,
                s.expression,
                s.tz,
                tick_label(self._next[s.name]),
                extra={"action": "schedule_start", "schedule": s.name},
            )
            return None
        paused = paused_key(s.name) in stored
        return Decision(s.name, s.plan(max(known), now), s.missed, paused=paused)

    async def _enqueue(self, decisions: list[Decision], now: float) -> bool:
        """Enqueue the ticks of every decision in one batch; False (nothing sent)
        when the lease may have run out meanwhile."""
        ticks = [(d, t) for d in decisions if not d.paused for t in d.plan.run]
        if not ticks:
            return True
        if time.monotonic() >= self._valid_until:
            return False  # renew first
        by = self.owner or ""
        msgs = [self.app.schedules[d.schedule].message(t, now, by) for d, t in ticks]
        jobs = await self.app._send(msgs)  # middleware sees ticks like any enqueue
        for (d, t), m, job in zip(ticks, msgs, jobs, strict=True):
            d.enqueued[t] = job.id
            if job.id != m.id:
                d.duplicates.append(t)
        return True

    def _record(
        self,
        s: Schedule,
        token: int,
        now: float,
        d: Decision | None,
        stored: dict[str, bytes],
    ) -> bytes:
        """The schedule's state entry: its definition, its mark, its last run."""
        prev = _load(stored.get(state_key(s.name))) or {}
        last_tick, last_job = prev.get("last_tick"), prev.get("last_job")
        if d is not None and d.enqueued:
            last_tick = max(d.enqueued)
            last_job = d.enqueued[last_tick]
        state = {
            **s.to_dict(),
            "through": self._through[s.name],
            "next_tick": self._next[s.name],
            "last_tick": last_tick,
            "last_job": last_job,
            "token": token,
            "by": self.owner,
            "updated_at": now,
        }
        return orjson.dumps(state)


def _log(d: Decision) -> None:
    """Every decision is logged, with ``extra`` fields a JSON log handler can index."""
    p, name = d.plan, d.schedule
    extra = {"schedule": name}
    if p.missed:
        if p.caught_up:
            how = f"running {len(p.caught_up)} of them as catch-up (missed={d.policy!r})"
        else:
            how = f"running none of them (missed={d.policy!r})"
        log.warning(
            "schedule %s missed ticks %s .. %s (older than its grace period); %s, %d not run",
            name,
            tick_label(p.missed_from or 0),
            tick_label(p.missed_to or 0),
            how,
            p.skipped,
            extra={**extra, "action": "schedule_missed", "skipped": p.skipped},
        )
    if d.paused and p.run:
        log.info(
            "schedule %s is paused: %d tick(s) not run (%s .. %s)",
            name,
            len(p.run),
            tick_label(p.run[0]),
            tick_label(p.run[-1]),
            extra={**extra, "action": "schedule_paused_skip"},
        )
        return
    caught = set(p.caught_up)
    for t, job_id in d.enqueued.items():
        if t in d.duplicates:
            log.info(
                "schedule %s tick %s was already enqueued (job %s); not again",
                name,
                tick_label(t),
                job_id,
                extra={**extra, "action": "tick_duplicate", "job_id": job_id},
            )
        else:
            log.info(
                "schedule %s tick %s enqueued%s: job %s",
                name,
                tick_label(t),
                " as a catch-up" if t in caught else "",
                job_id,
                extra={**extra, "action": "tick_enqueued", "job_id": job_id},
            )


# -- admin (dumbwaiter schedules) ----------------------------------------------------


@dataclass(slots=True)
class ScheduleInfo:
    """One schedule as ``dumbwaiter schedules ls`` shows it."""

    name: str
    task: str
    expression: str
    tz: str
    missed: str
    paused: bool
    last_run: float | None
    last_job: str | None
    next_run: float | None
    #: False when known only from the broker (its code is not in this app)
    in_code: bool = True
    paused_at: float | None = None
    last_trigger: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "expression": self.expression,
            "tz": self.tz,
            "missed": self.missed,
            "paused": self.paused,
            "paused_at": self.paused_at,
            "last_run": self.last_run,
            "last_job": self.last_job,
            "last_trigger": self.last_trigger,
            "next_run": self.next_run,
            "in_code": self.in_code,
        }


async def list_schedules(app: App, now: float | None = None) -> list[ScheduleInfo]:
    """The app's schedules merged with what the broker knows (last run, pause);
    schedules known only to the broker too (an app without code: ``--url``)."""
    broker = app.broker
    now = time.time() if now is None else now
    states = {
        k[len(STATE_PREFIX) :]: _load(v) or {}
        for k, v in (await broker.kv_scan(STATE_PREFIX)).items()
    }
    paused = {
        k[len(PAUSED_PREFIX) :]: _load(v) or {}
        for k, v in (await broker.kv_scan(PAUSED_PREFIX)).items()
    }
    triggers = {
        k[len(TRIGGER_PREFIX) :]: _load(v) or {}
        for k, v in (await broker.kv_scan(TRIGGER_PREFIX)).items()
    }
    out: list[ScheduleInfo] = []
    for name in sorted({*app.schedules, *states}):
        s = app.schedules.get(name)
        st = states.get(name, {})
        timetable: Timetable | None
        if s is not None:
            timetable = s.timetable
        else:
            try:
                timetable = Timetable.from_dict(st)
            except (ConfigurationError, KeyError, ValueError, TypeError):
                timetable = None
        through = _number(st, "through")
        start = max(now, through) if through is not None else now
        out.append(
            ScheduleInfo(
                name=name,
                task=s.task.name if s is not None else str(st.get("task", "?")),
                expression=timetable.expression if timetable else str(st.get("expression", "?")),
                tz=timetable.tz if timetable else str(st.get("tz", "?")),
                missed=s.missed if s is not None else str(st.get("missed", "?")),
                paused=name in paused,
                paused_at=paused.get(name, {}).get("at"),
                last_run=_number(st, "last_tick"),
                last_job=st.get("last_job"),
                last_trigger=triggers.get(name, {}).get("at"),
                next_run=timetable.next_after(start) if timetable else _number(st, "next_tick"),
                in_code=s is not None,
            )
        )
    return out


async def pause(broker: Broker, name: str, by: str = "") -> None:
    """Pause a schedule: ticks that fall while it is paused are not run (and not
    caught up on resume).  Kept in the broker, so it holds for every replica and
    across restarts."""
    await broker.kv_set({paused_key(name): orjson.dumps({"at": time.time(), "by": by})})


async def resume(broker: Broker, name: str) -> bool:
    """Undo ``pause``; False if it was not paused."""
    return await broker.kv_delete([paused_key(name)]) > 0


async def trigger(app: App, name: str, by: str = "") -> str:
    """Enqueue one run of schedule ``name`` now, outside its timetable (no tick
    key, so it never takes the place of a scheduled tick).  Works from the
    definition in the code, else from the one the leader stored in the broker."""
    now = time.time()
    s = app.schedules.get(name)
    if s is not None:
        msg = s.message(None, now, by)
    else:
        st = _load((await app.broker.kv_get([state_key(name)])).get(state_key(name)))
        if st is None:
            raise ConfigurationError(f"no schedule {name!r} in this app or in the broker")
        msg = _stored_message(name, st, now, by)
    [job] = await app._send([msg])
    job_id = job.id
    await app.broker.kv_set({trigger_key(name): orjson.dumps({"at": now, "job": job_id})})
    log.info(
        "schedule %s triggered by hand: job %s",
        name,
        job_id,
        extra={"action": "schedule_trigger", "schedule": name, "job_id": job_id},
    )
    return job_id


def _stored_message(name: str, st: dict[str, Any], now: float, by: str) -> Message:
    """The job of a schedule known only from the broker (no task code at hand)."""
    args, kwargs = st.get("args") or [], st.get("kwargs") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not st.get("task"):
        raise ConfigurationError(f"the stored definition of schedule {name!r} is unreadable")
    return Message(
        id=uuid7(),
        kind=TASK,
        name=str(st["task"]),
        queue=str(st.get("queue") or "default"),
        args=args,
        kwargs=kwargs,
        headers={"periodic": {"schedule": name, "by": by, "trigger": True}},
        max_attempts=int(st.get("max_attempts") or 4),
        created_at=now,
        priority=int(st.get("priority") or 0),
    )


def find(names: Sequence[str], wanted: str) -> str:
    """``wanted`` exactly, or the one name ending in ``.wanted`` (like tasks)."""
    if wanted in names:
        return wanted
    matches = [n for n in names if n.rsplit(".", 1)[-1] == wanted]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigurationError(
            f"schedule {wanted!r} is ambiguous: {', '.join(sorted(matches))}; give the full name"
        )
    known = ", ".join(sorted(names)) or "(none)"
    raise ConfigurationError(f"no schedule {wanted!r}; known: {known}")
