"""The replay core: what each ``ctx`` operation does, against checkpoints.

Every operation of a run (a step, a sleep, a wait, ``now()``...) takes the
next *position*.  A position whose checkpoint exists was done by an earlier
segment: the operation returns the recorded outcome without doing anything
(after checking the name and kind recorded there match the code's, else
``WorkflowCodeChanged``).  The first position without a checkpoint is where
the run really is; from there each operation does its work and records it.

Steps run at least once: a step is done when its checkpoint is stored, so a
step whose worker dies before that runs again, with the same idempotency
key (``ctx.step_key``: run id + step name).  A step with a checkpoint never
runs again.  Before a step starts, the segment checks it still owns the
run (the record's ``job``), so a cancelled run, or a run another segment
took over, runs no further step here.

The operations that wait raise ``Park``, a ``BaseException`` (so workflow
code that catches ``Exception`` cannot swallow it), which ends the segment
(see ``runner.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigurationError, SerializationError
from ..message import check_json, uuid7
from ..retry import Reject, Retry, RetryLater
from . import events, store
from .errors import StepFailed, StepTimeout, WorkflowCodeChanged
from .jobs import send
from .store import FINAL, PARENT_HEADER, Record

if TYPE_CHECKING:
    from ..event import Event
    from .api import DurableWorkflow
    from .host import Host

T = TypeVar("T")

#: the idempotency key of the step running in this task or thread
STEP_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dumbwaiter_step_key", default=None
)

#: checkpoints read at once when a replay needs more (doubling as it goes)
CHUNK = 16
#: a sleep whose wake time is this close (seconds) is over: a worker's clock
#: may run a little behind the one that set the eta
SLEEP_SLACK = 0.01


class Park(BaseException):
    """Ends the segment: the run waits at ``pos`` until ``until`` (epoch
    seconds; None: until something wakes it)."""

    def __init__(
        self,
        pos: int,
        kind: str,
        name: str,
        until: float | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.pos = pos
        self.kind = kind
        self.name = name
        self.until = until
        self.detail = detail or {}
        super().__init__(f"parked at {name!r} ({kind})")


class Fenced(BaseException):
    """This segment no longer owns the run (cancelled, or taken over by the job
    a wake-up enqueued): it stops where it is."""


@dataclass(slots=True)
class Compensation:
    pos: int
    name: str
    fn: Callable[..., Any]
    value: Any
    retry: Retry
    timeout: float | None


@dataclass(slots=True)
class StepPlan:
    """What ``step_begin`` found: a recorded outcome (``done``), or an attempt to make."""

    pos: int
    name: str
    key: str
    retry: Retry
    timeout: float | None
    compensate: Callable[..., Any] | None
    done: bool = False
    value: Any = None
    attempt: int = 1
    t0: float = 0.0
    tries: dict[str, Any] | None = field(default=None)


class Replay:
    """One segment's walk through a run."""

    def __init__(
        self,
        app: Host,
        wf: DurableWorkflow[Any, Any],
        rec: Record,
        job: str,
        *,
        virgin: bool,
        pool: Executor,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.app = app
        self.broker = app.broker
        self.wf = wf
        self.rec = rec
        self.run = str(rec["id"])
        self.job = job
        self.epoch = int(rec.get("epoch") or 0)
        self.pool = pool
        self.loop = loop
        #: a run created by this segment: no position has a checkpoint or a try
        self.virgin = virgin
        self.pos = 0
        #: position -> checkpoint, as loaded or written by this segment
        self.cache: dict[int, dict[str, Any]] = {}
        #: compensation checkpoints (key -> value) loaded or written
        self.comp_cache: dict[str, dict[str, Any]] = {}
        self.loaded = 0
        #: a position without a checkpoint was met: every later one is new too
        self.fresh = virgin
        self.names: set[str] = set()
        self.compensations: list[Compensation] = []
        self.in_step = False
        #: try and pending-wait keys to delete when the run ends
        self.cleanup: set[str] = set()
        #: (position, name) of the step (or child) whose final failure was raised
        self.failed: tuple[int, str] | None = None
        #: the record must be read again before the next step (see ``fence``)
        self.need_fence = False
        #: the segment was cancelled (worker shutdown): a sync workflow's thread,
        #: which cannot be stopped, must do nothing more
        self.stopped = False

    # -- positions and checkpoints ---------------------------------------------

    def preload(self, found: dict[str, bytes], upto: int) -> None:
        """Checkpoints of positions ``[0, upto)`` read with the record."""
        for p in range(upto):
            raw = found.get(store.ck_key(self.run, p))
            if raw is not None:
                self.cache[p] = dict(store.loads(raw))
        self.loaded = upto

    def take(self, name: str, kind: str, unique: bool = True) -> int:
        if self.stopped:
            raise Fenced()
        if self.in_step:
            raise ConfigurationError(
                f"ctx.{kind}({name!r}) was called inside a step's function; steps cannot "
                "nest (call it from the workflow function)"
            )
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"a workflow {kind} needs a name (a non-empty str), got {name!r}"
            )
        if unique:
            if name in self.names:
                raise ConfigurationError(
                    f"the name {name!r} is used twice in workflow {self.wf.name}; each step, "
                    "sleep and wait of a run needs its own name (in a loop: f'mail-{i}')"
                )
            self.names.add(name)
        p = self.pos
        self.pos += 1
        return p

    async def lookup(self, p: int) -> dict[str, Any] | None:
        ck = self.cache.get(p)
        if ck is not None or self.fresh:
            return ck
        if p >= self.loaded:
            n = max(CHUNK, self.loaded)
            keys = [store.ck_key(self.run, q) for q in range(p, p + n)]
            found = await self.broker.kv_get(keys)
            for q, k in zip(range(p, p + n), keys, strict=True):
                if k in found:
                    self.cache[q] = dict(store.loads(found[k]))
            self.loaded = p + n
            ck = self.cache.get(p)
        if ck is None:
            self.fresh = True
        return ck

    def check(self, p: int, name: str, kind: str, ck: dict[str, Any]) -> None:
        if ck.get("n") == name and ck.get("k") == kind:
            return
        raise WorkflowCodeChanged(
            f"workflow code changed at step {name!r}: run {self.run} of {self.wf.name} "
            f"(started on version {self.rec.get('version', 1)}) recorded "
            f"{ck.get('k')} {ck.get('n')!r} at position {p}, and the code now asks for "
            f"{kind} {name!r} there.  Keep the old order for runs in flight (branch on "
            "ctx.version, or ctx.patched('change-id')); see docs/durable-workflows.md, "
            "Versioning"
        )

    async def record(self, p: int, ck: dict[str, Any]) -> dict[str, Any]:
        """Store the checkpoint of ``p`` unless one is there: first writer wins,
        and a loser returns the winner's."""
        key = store.ck_key(self.run, p)
        if not await self.broker.kv_add(key, store.dumps(ck)):
            raw = (await self.broker.kv_get([key])).get(key)
            if raw is not None:
                ck = dict(store.loads(raw))
        self.cache[p] = ck
        return ck

    async def fence(self, extra: list[str]) -> dict[str, bytes]:
        """Read the record (and ``extra`` keys, same round trip); stop unless
        this segment still owns a live run."""
        key = store.run_key(self.run)
        found = await self.broker.kv_get([key, *extra])
        raw = found.get(key)
        rec = None if raw is None else dict(store.loads(raw))
        if rec is None or rec.get("job") != self.job or rec.get("status") in FINAL:
            raise Fenced()
        self.rec = rec
        return found

    def key_for(self, name: str) -> str:
        return f"{self.run}:{name}"

    # -- steps -----------------------------------------------------------------

    async def step_begin(
        self,
        name: str,
        retry: Retry | bool | None,
        timeout: Any,
        compensate: Callable[..., Any] | None,
    ) -> StepPlan:
        p = self.take(name, "step")
        if retry is None or retry is True:
            retry = self.wf.retry
        elif retry is False:
            retry = Retry.never()
        elif not isinstance(retry, Retry):
            raise ConfigurationError(f"step {name!r}: retry= takes a dw.Retry, got {retry!r}")
        if compensate is not None and not callable(compensate):
            raise ConfigurationError(f"step {name!r}: compensate= takes a function")
        plan = StepPlan(
            pos=p,
            name=name,
            key=self.key_for(name),
            retry=retry,
            timeout=_seconds(timeout) if timeout is not None else self.wf.step_timeout,
            compensate=compensate,
        )
        ck = await self.lookup(p)
        if ck is not None:
            self.check(p, name, "step", ck)
            return self._recorded(plan, ck)
        tkey = store.try_key(self.run, p)
        extra = [] if self.virgin else [tkey]
        if self.need_fence or extra:
            found = await self.fence(extra)
            raw = found.get(tkey)
            plan.tries = None if raw is None else dict(store.loads(raw))
        self.need_fence = True
        if plan.tries:
            self.cleanup.add(tkey)
            plan.attempt = int(plan.tries.get("a") or 0) + 1
            due = plan.tries.get("next")
            if isinstance(due, int | float) and due > time.time() + SLEEP_SLACK:
                raise Park(p, "retry", name, float(due), {"attempt": plan.attempt})
        plan.t0 = time.time()
        return plan

    def _recorded(self, plan: StepPlan, ck: dict[str, Any]) -> StepPlan:
        if "e" in ck:
            self.failed = (plan.pos, plan.name)
            raise StepFailed.from_record(plan.name, ck["e"])
        plan.done = True
        plan.value = ck.get("v")
        if plan.compensate is not None:
            self.compensations.append(
                Compensation(
                    plan.pos, plan.name, plan.compensate, plan.value, plan.retry, plan.timeout
                )
            )
        return plan

    async def step_end(self, plan: StepPlan, value: Any, exc: BaseException | None) -> Any:
        t1 = time.time()
        if exc is None:
            try:
                check_json(value, f"the result of step {plan.name!r}")
            except SerializationError as bad:
                exc = Reject(f"{bad}; a step's result is checkpointed, so it must be JSON")
        self._observe(plan.name, t1 - plan.t0, exc is None)
        if exc is None:
            ck = {"n": plan.name, "k": "step", "v": value, "t0": plan.t0, "t1": t1}
            ck["a"] = plan.attempt
            ck = await self.record(plan.pos, ck)
            if plan.tries:
                await self.broker.kv_delete([store.try_key(self.run, plan.pos)])
            return self._recorded(plan, ck).value
        err = store.error_record(exc, plan.name)
        at = retry_at(exc, plan.attempt, plan.retry)
        if at is not None:
            errors = list((plan.tries or {}).get("errors") or [])[-4:]
            errors.append({k: err[k] for k in ("type", "message", "time")} | {"a": plan.attempt})
            tries = {"n": plan.name, "a": plan.attempt, "next": at, "errors": errors}
            await self.broker.kv_set({store.try_key(self.run, plan.pos): store.dumps(tries)})
            raise Park(plan.pos, "retry", plan.name, at, {"attempt": plan.attempt + 1})
        ck = {"n": plan.name, "k": "step", "e": err, "t0": plan.t0, "t1": t1, "a": plan.attempt}
        ck = await self.record(plan.pos, ck)
        try:
            return self._recorded(plan, ck).value
        except StepFailed as failed:
            raise failed from exc

    def _observe(self, step: str, seconds: float, ok: bool) -> None:
        mw = self.app.middleware
        if mw.has("on_workflow_step"):
            mw.call("on_workflow_step", self.wf.name, step, seconds, ok)

    # -- sleeps, values, patches -----------------------------------------------

    async def sleep(self, name: str, seconds: float | None, until: float | None) -> None:
        """Sleep ``seconds`` from the first time the run gets here, or ``until``:
        the wake time is the checkpoint, so a replay sleeps what is left."""
        p = self.take(name, "sleep")
        ck = await self.lookup(p)
        if ck is not None:
            self.check(p, name, "sleep", ck)
        else:
            now = time.time()
            wake = until if until is not None else now + (seconds or 0.0)
            ck = await self.record(p, {"n": name, "k": "sleep", "v": wake, "t0": now})
        wake = float(ck["v"])
        if time.time() >= wake - SLEEP_SLACK:
            return
        raise Park(p, "sleep", name, wake)

    async def value(self, kind: str, make: Callable[[], Any]) -> Any:
        """A checkpointed value (``now``, ``uuid``): made once, replayed after."""
        p = self.take(kind, kind, unique=False)
        ck = await self.lookup(p)
        if ck is not None:
            self.check(p, kind, kind, ck)
        else:
            ck = await self.record(p, {"n": kind, "k": kind, "v": make()})
        return ck.get("v")

    async def patched(self, change: str) -> bool:
        if not isinstance(change, str) or not change:
            raise ConfigurationError(f"ctx.patched() takes a change id (a str), got {change!r}")
        if self.stopped:
            raise Fenced()
        p = self.pos
        ck = await self.lookup(p)
        if ck is None:
            ck = await self.record(p, {"n": change, "k": "patch", "v": True})
        if ck.get("k") == "patch" and ck.get("n") == change:
            self.pos += 1
            return True
        return False  # this run went past here before the change: the old path

    # -- waiting for events ------------------------------------------------------

    async def wait_event(
        self,
        name: str,
        event: type[Event],
        match: dict[str, Any] | None,
        timeout: float | None,
    ) -> Any:
        event_type = getattr(event, "event_type", "")
        if not (isinstance(event, type) and event_type):
            raise ConfigurationError(f"wait_for_event takes a dw.Event class, got {event!r}")
        version = int(getattr(event, "event_version", 1))
        wanted = events.check_match(match, event_type)
        p = self.take(name, "event")
        ck = await self.lookup(p)
        if ck is not None:
            self.check(p, name, "event", ck)
            return _event_of(event, ck)
        pkey = store.pend_key(self.run, p)
        raw = (await self.broker.kv_get([pkey])).get(pkey)
        now = time.time()
        pend: dict[str, Any]
        if raw is None:
            pend = {
                "deadline": None if timeout is None else now + timeout,
                "event": event_type,
                "match": wanted,
                "t0": now,
            }
            if not await self.broker.kv_add(pkey, store.dumps(pend)):
                raw = (await self.broker.kv_get([pkey])).get(pkey)
        if raw is not None:
            pend = dict(store.loads(raw))
        self.cleanup.add(pkey)
        due = pend.get("deadline")
        deadline = None if due is None else float(due)
        if deadline is not None and now >= deadline:
            ck = await self.record(
                p, {"n": name, "k": "event", "v": None, "timeout": True, "t1": now}
            )
            await events.unregister(self.app, event_type, wanted, self.run, p)
            return _event_of(event, ck)
        await events.register(self.app, self.run, p, name, event_type, version, wanted, deadline)
        detail = {"event": event_type, "match": wanted}
        raise Park(p, "event", name, deadline, detail)

    # -- child workflows -----------------------------------------------------------

    async def child(
        self,
        name: str,
        workflow: DurableWorkflow[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        p = self.take(name, "child")
        ck = await self.lookup(p)
        if ck is not None:
            self.check(p, name, "child", ck)
            if "e" in ck:
                self.failed = (p, name)
                raise StepFailed.from_record(name, ck["e"])
            return ck.get("v")
        child = store.child_run_id(self.run, self.epoch, name)
        parent = {"run": self.run, "pos": p, "name": name}
        msg = workflow.start_message(args, kwargs, run_id=child)
        msg.headers[PARENT_HEADER] = parent
        await send(self.app, [msg])
        raise Park(p, "child", name, None, {"run": child, "workflow": workflow.name})

    # -- compensation (the saga) -------------------------------------------------

    async def compensate(self) -> list[dict[str, Any]]:
        """Run the compensations of the completed steps, last first; each is
        checkpointed like a step (``c`` + the step's position) and retried
        by the step's policy.  Returns the errors of those that failed for
        good (the others still ran)."""
        comps = list(reversed(self.compensations))
        if not comps:
            return []
        keys = [store.ck_key(self.run, f"c{c.pos:06d}") for c in comps]
        found = await self.broker.kv_get(keys)
        errors: list[dict[str, Any]] = []
        for c, key in zip(comps, keys, strict=True):
            raw = found.get(key)
            if raw is not None:
                ck = dict(store.loads(raw))
                self.comp_cache[key] = ck
                if "e" in ck:
                    errors.append(ck["e"])
                continue
            tkey = store.try_key(self.run, f"c{c.pos:06d}")
            got = await self.fence([tkey])
            tries = None if tkey not in got else dict(store.loads(got[tkey]))
            attempt = 1
            if tries:
                self.cleanup.add(tkey)
                attempt = int(tries.get("a") or 0) + 1
                due = tries.get("next")
                if isinstance(due, int | float) and due > time.time() + SLEEP_SLACK:
                    raise Park(c.pos, "compensate", c.name, float(due), {"attempt": attempt})
            t0 = time.time()
            label = f"{c.name}:compensate"
            try:
                await call_async(c.fn, (c.value,), c.timeout, self.key_for(label), self.pool)
            except Exception as exc:
                self._observe(label, time.time() - t0, False)
                err = store.error_record(exc, label)
                at = retry_at(exc, attempt, c.retry)
                if at is not None:
                    short = {k: err[k] for k in ("type", "message", "time")} | {"a": attempt}
                    tries = {"n": label, "a": attempt, "next": at, "errors": [short]}
                    await self.broker.kv_set({tkey: store.dumps(tries)})
                    raise Park(c.pos, "compensate", c.name, at, {"attempt": attempt + 1}) from None
                ck = {"n": label, "k": "compensate", "e": err, "t0": t0, "t1": time.time()}
                errors.append(err)
            else:
                self._observe(label, time.time() - t0, True)
                ck = {"n": label, "k": "compensate", "v": None, "t0": t0, "t1": time.time()}
            if not await self.broker.kv_add(key, store.dumps(ck)):
                ck = dict(store.loads((await self.broker.kv_get([key]))[key]))
            self.comp_cache[key] = ck
        return errors


def retry_at(exc: BaseException, attempt: int, retry: Retry) -> float | None:
    """When to try a failed step again, or None when it failed for good."""
    if isinstance(exc, Reject):
        return None
    if isinstance(exc, RetryLater):
        return time.time() + exc.after if attempt < retry.attempts else None
    if retry.should_retry(exc, attempt, retry.attempts):
        return time.time() + retry.wait(attempt)
    return None


def _event_of(event: type[Event], ck: dict[str, Any]) -> Any:
    if ck.get("timeout") or ck.get("v") is None:
        return None
    return event.model_validate(ck["v"])


def _seconds(value: Any) -> float:
    from datetime import timedelta

    s = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(s, int | float) or isinstance(s, bool) or s <= 0:
        raise ConfigurationError(f"a step timeout must be positive seconds, got {value!r}")
    return float(s)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or bool(getattr(fn, "is_async", False))


async def call_async(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: float | None,
    key: str,
    pool: Executor,
) -> Any:
    """Run a step's function from async code: an async one on the loop, a sync
    one in ``pool`` (never blocking the loop), within ``timeout``."""
    token = STEP_KEY.set(key)
    try:
        if _is_async(fn):
            work: Any = fn(*args)
        else:
            cv = contextvars.copy_context()
            work = asyncio.get_running_loop().run_in_executor(pool, cv.run, fn, *args)
            if timeout is not None:
                work = asyncio.shield(work)
        try:
            async with asyncio.timeout(timeout):
                result = await work
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError:
            raise StepTimeout(
                f"step {key.split(':', 1)[-1]!r} ran longer than its timeout of {timeout:g} s"
                + ("" if _is_async(fn) else " (a sync step's thread runs on to its end)")
            ) from None
        return result
    finally:
        STEP_KEY.reset(token)


def call_sync(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: float | None,
    key: str,
    loop: asyncio.AbstractEventLoop,
) -> Any:
    """Run a step's function from a sync workflow's thread: a sync one right
    here (in a thread of its own when it has a timeout), an async one on the
    worker's loop."""
    if _is_async(fn):
        return asyncio.run_coroutine_threadsafe(
            call_async(fn, args, timeout, key, _NO_POOL), loop
        ).result()
    token = STEP_KEY.set(key)
    try:
        if timeout is None:
            result = fn(*args)
        else:
            result = _in_thread(fn, args, timeout, key)
        if inspect.isawaitable(result):
            result = asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
        return result
    finally:
        STEP_KEY.reset(token)


async def _awaited(aw: Any) -> Any:
    return await aw


class _NoPool(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("an async step needs no thread pool")


_NO_POOL = _NoPool()


def _in_thread(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float, key: str) -> Any:
    box: dict[str, Any] = {}
    cv = contextvars.copy_context()

    def target() -> None:
        try:
            box["v"] = cv.run(fn, *args)
        except BaseException as exc:
            box["e"] = exc

    t = threading.Thread(target=target, name="dumbwaiter-step", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise StepTimeout(
            f"step {key.split(':', 1)[-1]!r} ran longer than its timeout of {timeout:g} s "
            "(a sync step's thread runs on to its end)"
        )
    if "e" in box:
        raise box["e"]
    return box.get("v")


def new_uuid() -> str:
    return uuid7()
