"""Workflows: ``task.s(...)`` signatures, ``chain``, ``group`` and ``chord``.

A workflow is ordinary jobs that know what comes after them.  Each job
carries the rest of its workflow in its headers; when it succeeds, the worker
enqueues the next step, with the result, *before* it acks, under a job id
derived from the workflow's id and the step's place: if the worker dies in
between, the step runs again and enqueues the same id, which the broker
de-duplicates.  So a chain never stalls and never forks.

* ``chain(a.s(1), b.s(), c.s())``: each step gets the previous result as its
  first argument (``si()`` for a step that does not).  A failed step stops
  the chain and is dead-lettered with the workflow id in its headers;
  replaying it resumes the workflow where it stopped.
* ``group(a.s(i) for i in ...)``: in parallel; its result is the list of the
  members' results.
* ``chord(group, callback.s())``: the callback gets the list of results, once,
  when the last member succeeds.  Members record their result and add their
  index to a set in the broker (``kv_sadd``, atomic); the member that
  completes the set enqueues the callback under its derived id, so members
  finishing together on different workers, or retried, still fire it once.

Results are kept in the broker's kv store for ``result_ttl`` (a day).

A workflow that cannot finish (a step dead, or cancelled) makes
``Workflow.result()`` raise ``WorkflowFailed`` naming the step.  The jobs'
states are the truth: the waiter reads the states of the planned steps'
jobs.  To learn of a death at once without reading them on every poll, the
worker that dead-letters a step writes a hint (``wf:ID:dead``) as it decides
(``mark_dead``, from the ``on_dead`` hook), read in the same ``kv_get`` as
the result; the dead letter is stored a moment later, so the waiter checks
the states at each poll for ``HINT_WINDOW`` seconds after a new hint.  The
hooks live in ``lifecycle.WorkflowSteps``, a middleware the App registers:
the worker knows nothing of workflows.  A step that died another way
(cancelled, dead-lettered by an operator) is found by a full look every few
seconds.
Replaying the step resumes the workflow, and a waiter sees it alive again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import orjson

from . import keys
from .brokers import deadline
from .errors import (
    ConfigurationError,
    JobNotFound,
    ResultTimeout,
    SerializationError,
    WorkflowFailed,
)
from .message import Message, check_json, uuid7
from .retry import Reject
from .state import State

if TYPE_CHECKING:
    from .brokers.types import JobInfo
    from .ports import Runtime, TaskRef

#: results and workflow records stay this long in the broker (seconds)
DEFAULT_RESULT_TTL = 86400.0
#: seconds between a waiter's full looks at its steps' states (doubling up to
#: the second figure); a worker's hint (``mark_dead``) makes it look at once
FULL_LOOK_FIRST, FULL_LOOK_MAX = 1.0, 8.0
#: seconds a waiter keeps looking at each poll after a new hint: the hint is
#: written before its dead letter is stored
HINT_WINDOW = 2.0

#: every key of a workflow starts ``wf:ID``
WF = keys.WORKFLOW

Step = Union["Signature", "Group", "Chord"]


def derived_id(*parts: str) -> str:
    """A job id computed from the workflow id and the step's place (UUID-shaped,
    version 8), so a step enqueued twice is one job."""
    h = bytearray(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).digest())
    h[6] = (h[6] & 0x0F) | 0x80
    h[8] = (h[8] & 0x3F) | 0x80
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


@dataclass(frozen=True)
class Signature:
    """A task call not made yet: ``send.s(42)``; ``immutable`` steps (``si``)
    do not receive the previous step's result."""

    task: TaskRef
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    immutable: bool = False

    def __post_init__(self) -> None:
        check_json(list(self.args), f"the arguments of {self.task.name}.s()")
        check_json(self.kwargs, f"the arguments of {self.task.name}.s()")

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.task.name,
            "a": list(self.args),
            "k": self.kwargs,
            "p": not self.immutable,
        }

    def enqueue(self) -> Workflow:
        return chain(self).enqueue()

    async def aenqueue(self) -> Workflow:
        return await chain(self).aenqueue()


@dataclass(frozen=True)
class Group:
    members: tuple[Signature, ...]

    def to_json(self) -> dict[str, Any]:
        return {"g": [m.to_json() for m in self.members], "then": None}

    def enqueue(self) -> Workflow:
        return chain(self).enqueue()

    async def aenqueue(self) -> Workflow:
        return await chain(self).aenqueue()


@dataclass(frozen=True)
class Chord:
    group: Group
    callback: Signature

    def to_json(self) -> dict[str, Any]:
        return {"g": [m.to_json() for m in self.group.members], "then": self.callback.to_json()}

    def enqueue(self) -> Workflow:
        return chain(self).enqueue()

    async def aenqueue(self) -> Workflow:
        return await chain(self).aenqueue()


def group(*members: Signature | Iterable[Signature]) -> Group:
    """``dw.group(a.s(1), a.s(2))`` or ``dw.group(a.s(i) for i in range(10))``."""
    flat: list[Signature] = []
    for m in members:
        if isinstance(m, Signature):
            flat.append(m)
        else:
            flat.extend(m)
    if not flat or not all(isinstance(m, Signature) for m in flat):
        raise ConfigurationError("group() takes task signatures (task.s(...)), at least one")
    return Group(tuple(flat))


def chord(members: Group | Iterable[Signature], callback: Signature) -> Chord:
    """``dw.chord(dw.group(...), summarize.s())``: the callback gets every result."""
    g = members if isinstance(members, Group) else group(members)
    if not isinstance(callback, Signature):
        raise ConfigurationError("chord(group, callback): the callback is a task.s(...)")
    return Chord(g, callback)


@dataclass(frozen=True)
class Chain:
    steps: tuple[Step, ...]
    result_ttl: float = DEFAULT_RESULT_TTL

    def enqueue(self) -> Workflow:
        """Start the workflow (sync callers); returns its handle.  A producer
        call: it waits for the broker up to the App's ``enqueue_timeout``."""
        app = _app_of(self.steps[0])
        return app._call(self.aenqueue())

    async def aenqueue(self) -> Workflow:
        app = _app_of(self.steps[0])
        token = deadline.start(app.enqueue_timeout)
        try:
            wf = uuid7()
            steps = [s.to_json() for s in self.steps]
            record = {"id": wf, "created_at": time.time(), "steps": _plan(wf, steps)}
            await app.broker.kv_set({f"{WF}{wf}": orjson.dumps(record)}, ttl=self.result_ttl)
            await start(app, wf, self.result_ttl, steps, 0, None, has_prev=False)
            return Workflow(app, wf)
        finally:
            deadline.end(token)


def chain(*steps: Step, result_ttl: float = DEFAULT_RESULT_TTL) -> Chain:
    """``dw.chain(a.s(1), b.s(), c.s())``: one after the other, results passed on."""
    if not steps or not all(isinstance(s, Signature | Group | Chord) for s in steps):
        raise ConfigurationError("chain() takes signatures, groups and chords, at least one")
    norm: list[Step] = []
    for s in steps:  # a group followed by a step is a chord into that step
        if norm and isinstance(norm[-1], Group) and isinstance(s, Signature):
            norm[-1] = Chord(norm[-1], s)
        else:
            norm.append(s)
    return Chain(tuple(norm), result_ttl)


def _app_of(step: Step) -> Runtime:
    sig = (
        step
        if isinstance(step, Signature)
        else (step.members[0] if isinstance(step, Group) else step.group.members[0])
    )
    return sig.task.app


def _plan(wf: str, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every step's job id, computed up front (for ``dumbwaiter jobs show``)."""
    out: list[dict[str, Any]] = []
    for i, s in enumerate(steps):
        if "g" not in s:
            out.append({"path": str(i), "task": s["t"], "job": derived_id(wf, str(i))})
            continue
        for j, m in enumerate(s["g"]):
            p = f"{i}.{j}"
            out.append({"path": p, "task": m["t"], "job": derived_id(wf, p)})
        if s["then"] is not None:
            p = f"{i}.then"
            out.append({"path": p, "task": s["then"]["t"], "job": derived_id(wf, p)})
    return out


async def start(
    app: Runtime,
    wf: str,
    ttl: float,
    steps: list[dict[str, Any]],
    index: int,
    prev: Any,
    *,
    has_prev: bool,
) -> None:
    """Enqueue step ``index`` of ``steps`` (with the previous result)."""
    step = steps[index]
    meta = {"id": wf, "steps": steps, "i": index, "ttl": ttl}
    if "g" not in step:
        await _send(app, [_message(app, step, derived_id(wf, str(index)), prev, has_prev, meta)])
        return
    members = step["g"]
    msgs = []
    for j, m in enumerate(members):
        msg = _message(app, m, derived_id(wf, f"{index}.{j}"), prev, has_prev, meta)
        msg.headers["chord"] = {"j": j, "n": len(members)}
        msgs.append(msg)
    await _send(app, msgs)


def _message(
    app: Runtime,
    step: dict[str, Any],
    id: str,
    prev: Any,
    has_prev: bool,
    meta: dict[str, Any],
) -> Message:
    task = app.tasks.get(step["t"])
    if task is None:
        raise ConfigurationError(f"workflow step {step['t']!r} is not a task of this app")
    args = ([prev] if has_prev and step["p"] else []) + list(step["a"])
    msg = task.message(tuple(args), dict(step["k"]))
    msg.id = id
    msg.headers["wf"] = meta
    msg.headers["correlation_id"] = meta["id"]  # the whole workflow shares one
    return msg


async def _send(app: Runtime, msgs: list[Message]) -> None:
    await app._send(msgs)


async def advance(app: Runtime, msg: Message, result: Any) -> None:
    """After a workflow step succeeded (before its ack): record its result and
    enqueue what comes next.  Raises if the result cannot travel."""
    meta = msg.headers["wf"]
    wf, steps, i, ttl = meta["id"], meta["steps"], int(meta["i"]), float(meta["ttl"])
    try:
        check_json(result, f"the result of workflow step {msg.name}")
    except SerializationError as exc:
        raise Reject(f"{exc}; a workflow step's result is passed on, so it must be JSON") from None
    chord_info = msg.headers.get("chord")
    if chord_info is not None:
        await _member_done(app, wf, steps, i, ttl, chord_info, result)
        return
    await app.broker.kv_set({f"{WF}{wf}:r:{i}": orjson.dumps(result)}, ttl=ttl)
    await _next(app, wf, steps, i, ttl, result)


async def _member_done(
    app: Runtime,
    wf: str,
    steps: list[dict[str, Any]],
    i: int,
    ttl: float,
    info: dict[str, Any],
    result: Any,
) -> None:
    j, n = int(info["j"]), int(info["n"])
    b = app.broker
    await b.kv_set({f"{WF}{wf}:r:{i}.{j}": orjson.dumps(result)}, ttl=ttl)
    if await b.kv_sadd(f"{WF}{wf}:done:{i}", str(j), ttl=ttl) < n:
        return
    # the last member: collect the results in order and go on (idempotent:
    # a member that runs again re-enqueues the same derived id)
    keys = [f"{WF}{wf}:r:{i}.{k}" for k in range(n)]
    found = await b.kv_get(keys)
    results = [orjson.loads(found[k]) if k in found else None for k in keys]
    then = steps[i]["then"]
    if then is None:
        await b.kv_set({f"{WF}{wf}:r:{i}": orjson.dumps(results)}, ttl=ttl)
        await _next(app, wf, steps, i, ttl, results)
        return
    meta = {"id": wf, "steps": steps, "i": i, "ttl": ttl, "then": True}
    msg = _message(app, then, derived_id(wf, f"{i}.then"), results, True, meta)
    await _send(app, [msg])


async def _next(
    app: Runtime, wf: str, steps: list[dict[str, Any]], i: int, ttl: float, result: Any
) -> None:
    if i + 1 < len(steps):
        await start(app, wf, ttl, steps, i + 1, result, has_prev=True)
    else:
        await app.broker.kv_set({f"{WF}{wf}:result": orjson.dumps([result])}, ttl=ttl)


async def mark_dead(app: Runtime, msgs: Iterable[Message | None]) -> None:
    """After workflow steps were dead-lettered: leave their workflows' waiters
    a hint (``wf:ID:dead``) so ``result()`` fails at once, not at its next
    full look.  Only a hint: the waiter checks the step's state."""
    by_ttl: dict[float, dict[str, bytes]] = {}
    now = time.time()
    for m in msgs:
        meta = m.headers.get("wf") if m is not None else None
        if m is None or not isinstance(meta, dict) or not meta.get("id"):
            continue
        hint = orjson.dumps({"job": m.id, "task": m.name, "at": now})
        ttl = float(meta.get("ttl") or DEFAULT_RESULT_TTL)
        by_ttl.setdefault(ttl, {})[f"{WF}{meta['id']}:dead"] = hint
    for ttl, items in by_ttl.items():
        await app.broker.kv_set(items, ttl=ttl)


class Workflow:
    """The handle of a started workflow."""

    def __init__(self, app: Runtime, id: str) -> None:
        self.app = app
        self.id = id

    def __repr__(self) -> str:
        return f"<Workflow {self.id}>"

    async def asteps(self) -> list[dict[str, Any]]:
        """Every step with its job id and state (``pending`` until enqueued)."""
        return await steps_of(self.app, self.id)

    def steps(self) -> list[dict[str, Any]]:
        return self.app._call(self.asteps())

    async def astatus(self) -> State:
        """``succeeded`` once the last step's result is stored; ``dead`` if a
        step is dead (``result()`` raises ``WorkflowFailed``), ``cancelled``
        if one was cancelled; otherwise the most advanced state among its
        unfinished steps (``running``, ``retrying``, ``ready``, ``scheduled``).
        Raises ``JobNotFound`` for a workflow not stored (never started, or
        expired after its ``result_ttl``)."""
        if await self.app.broker.kv_get([f"{WF}{self.id}:result"]):
            return State.SUCCEEDED
        looked = await _look(self.app, self.id)
        if looked is None:
            raise JobNotFound(
                f"no workflow {self.id} is stored (never started, or expired after its result_ttl)"
            )
        states = {info.state for _, info in looked if info is not None}
        for s in (State.DEAD, State.CANCELLED, State.RUNNING, State.RETRYING, State.READY):
            if s in states:
                return s
        return State.SCHEDULED if State.SCHEDULED in states else State.READY

    def status(self) -> State:
        return self.app._call(self.astatus())

    async def aresult(self, timeout: float | None = None) -> Any:
        """Wait for the last step's result (None: for ever).  Raises
        ``WorkflowFailed`` as soon as a step is dead or cancelled (the workflow
        cannot finish until it is replayed), ``ResultTimeout`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = [f"{WF}{self.id}:result", f"{WF}{self.id}:dead"]
        pause = 0.005
        hint: bytes | None = None
        hinted_until = 0.0
        every = FULL_LOOK_FIRST
        next_look = time.monotonic() + every
        done: set[str] = set()  # step jobs seen succeeded: not read again
        while True:
            found = await self.app.broker.kv_get(keys)
            if keys[0] in found:
                return orjson.loads(found[keys[0]])[0]
            now = time.monotonic()
            new_hint = found.get(keys[1])
            late = deadline is not None and now >= deadline
            if new_hint is not None and new_hint != hint:
                hint, hinted_until = new_hint, now + HINT_WINDOW
            scheduled = now >= next_look or late
            if scheduled or now < hinted_until:
                failed = await self._failure(done)
                if failed is not None:
                    raise failed
                if scheduled:
                    next_look = now + every
                    every = min(every * 2, FULL_LOOK_MAX)
            if late:
                raise ResultTimeout(f"workflow {self.id} has not finished after {timeout} s")
            wait = pause if deadline is None else min(pause, max(deadline - now, 0))
            await asyncio.sleep(wait)
            pause = min(pause * 2, 0.1)

    def result(self, timeout: float | None = None) -> Any:
        return self.app._call(self.aresult(timeout))

    async def _failure(self, done: set[str]) -> WorkflowFailed | None:
        """The error of the first step (in plan order) that is dead or cancelled."""
        for step, info in await _look(self.app, self.id, done) or []:
            if info is None:
                continue
            if info.state is State.SUCCEEDED:
                done.add(step["job"])
            elif info.state in (State.DEAD, State.CANCELLED):
                return _failed(self.id, step, info)
        return None


def _failed(wf: str, step: dict[str, Any], info: JobInfo) -> WorkflowFailed:
    path, task, job = str(step["path"]), str(step["task"]), str(step["job"])
    where = f"step {path} ({task}, job {job})"
    if info.state is State.CANCELLED:
        return WorkflowFailed(
            f"workflow {wf} cannot finish: {where} was cancelled",
            workflow_id=wf,
            step=path,
            task=task,
            job_id=job,
        )
    last = info.message.errors[-1] if info.message.errors else None
    why = f"{last.type}: {last.message}" if last else "no error recorded"
    return WorkflowFailed(
        f"workflow {wf} failed: {where} is dead: {why} "
        f"(replay the job to resume the workflow there)",
        workflow_id=wf,
        step=path,
        task=task,
        job_id=job,
        error_type=last.type if last else None,
        error=last.message if last else None,
    )


async def _look(
    app: Runtime, wf: str, skip: set[str] | frozenset[str] = frozenset()
) -> list[tuple[dict[str, Any], JobInfo | None]] | None:
    """Every planned step with its stored job (None: not enqueued yet, or in
    ``skip``); None if the workflow is not stored."""
    raw = (await app.broker.kv_get([f"{WF}{wf}"])).get(f"{WF}{wf}")
    if raw is None:
        return None
    out: list[tuple[dict[str, Any], JobInfo | None]] = []
    for s in orjson.loads(raw)["steps"]:
        out.append((s, None if s["job"] in skip else await app.broker.get(s["job"])))
    return out


async def steps_of(app: Runtime, wf: str) -> list[dict[str, Any]]:
    return [
        {**s, "state": "pending" if info is None else str(info.state)}
        for s, info in await _look(app, wf) or []
    ]
