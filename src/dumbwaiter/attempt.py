"""One attempt of a job, as a worker runs it: the handler found and its
arguments bound, the task's rate and concurrency limits taken (or the job
held back), the handler run through the middleware (on the loop, or on a
thread of the pool for a sync task, under its timeout), and the outcome
decided: ack, retry or dead, recorded on the delivery for the settler
(settle.py).

``Attempt`` is a part of ``Worker`` (worker.py), which runs it for each
job it fetched; the attributes declared below are the worker's.
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import logging
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from . import keys
from .cancel import Cancels
from .context import Context, reset_current, set_current
from .errors import InvalidArguments, JobTimeout, MessageDecodeError, UnknownTask
from .message import Message, undecodable
from .redact import mask_url
from .retry import Reject, RetryLater
from .settle import ACK, DEAD, REQUEUE, RETRY, error_record, result_record
from .worker_config import WorkerApp, WorkerConfig

if TYPE_CHECKING:
    from typing import TypeAlias

    from .brokers.base import Broker
    from .brokers.types import Delivery
    from .event import Subscription
    from .flow import Flow
    from .task import Task

    #: what runs a message: a task, or a group's event handler
    Handler: TypeAlias = Task | Subscription

# the worker's lines, under the logger people configure for it
log = logging.getLogger("dumbwaiter.worker")


class Attempt:
    """Running one attempt (see the module doc)."""

    app: WorkerApp
    broker: Broker
    config: WorkerConfig
    id: str
    counts: dict[str, int]
    _cancels: Cancels
    _loop: asyncio.AbstractEventLoop | None
    _pool: ThreadPoolExecutor | None
    #: threads of timed-out sync jobs that still run
    _stuck: int
    #: set when a slot may be free (the fetch loop waits on it)
    _slot: asyncio.Event
    #: the context of each job ``_dead`` decided dead, for ``on_dead``
    _dying: dict[str, Context | None]
    #: per task: moving average run time
    _task_time: dict[str, float]

    async def _execute(self, d: Delivery) -> str:
        msg = d.message
        if msg is None:
            return self._dead(d, None, MessageDecodeError(undecodable(d.raw, d.decode_error)))
        if d.duplicate:
            log.debug("event %s already handled by %s: acked", msg.id, msg.queue)
            self.counts["duplicates"] += 1
            return ACK
        task = self.app.handler(msg)
        if task is None:
            return self._dead(d, None, self._unknown(msg))
        try:
            args, kwargs = task.bind(msg)
        except InvalidArguments as exc:
            return self._dead(d, None, exc)
        started_at = time.time()
        flow = getattr(task, "flow", None)
        if flow is not None and flow.limited:
            if not await self._admit(d, task.name, flow, started_at):
                return REQUEUE
            started_at = d.started_at
        d.started_at = started_at
        ctx = Context(
            message=msg,
            app=self.app,
            worker_id=self.id,
            deadline=None if task.timeout is None else time.monotonic() + task.timeout,
            started_at=started_at,
            loop=self._loop,
        )
        self._cancels.attach(d.id, ctx)
        if task.context_param is not None:
            kwargs[task.context_param] = ctx
        return await self._run_handler(d, task, args, kwargs, ctx)

    async def _run_handler(
        self,
        d: Delivery,
        task: Handler,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ctx: Context,
    ) -> str:
        """One attempt through the middleware; the outcome's kind."""
        mw = self.app.middleware
        used = mw.used
        result: Any = None
        try:
            if "before_process" in used:
                mw.call("before_process", ctx)
            if "around_process" in used:
                result = await mw.around(ctx, lambda: self._call(task, args, kwargs, ctx))
            else:
                result = await self._call(task, args, kwargs, ctx)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # every failure is recorded
            if "after_process" in used:
                mw.call("after_process", ctx, None, exc)
            return self._failed(d, ctx, task, exc)
        ctx.state["result"] = result
        # a plain job (no workflow, batch or checkpoint) has nothing to set off
        if mw.runs("after_success", ctx.message) or "checkpointed" in ctx.state:
            try:
                await self._after_success(ctx)
            except Exception as exc:
                return self._failed(d, ctx, task, exc)
        if "after_process" in used:
            mw.call("after_process", ctx, result, None)
        d.result = result_record(result, task, d.started_at)
        if task.keep_result is not None:
            d.result_ttl = task.keep_result
        return ACK

    async def _call(
        self, task: Handler, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Context
    ) -> Any:
        timeout = task.timeout
        if task.is_async:
            token = set_current(ctx)
            try:
                if timeout is None:
                    return await task.fn(*args, **kwargs)
                try:
                    async with asyncio.timeout(timeout):
                        return await task.fn(*args, **kwargs)
                except TimeoutError:
                    raise JobTimeout(
                        f"{task.name} ran longer than its timeout of {timeout:g} s"
                    ) from None
            finally:
                reset_current(token)
        assert self._loop is not None and self._pool is not None
        cv = contextvars.copy_context()
        cv.run(set_current, ctx)
        fut = self._loop.run_in_executor(self._pool, _call_kw, cv, task.fn, args, kwargs)
        if timeout is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            # A thread cannot be interrupted: the job is failed now, but its
            # thread runs on and keeps its slot until it returns.
            self._stuck += 1
            fut.add_done_callback(self._unstick)
            raise JobTimeout(
                f"{task.name} ran longer than its timeout of {timeout:g} s "
                "(a sync task's thread cannot be stopped; it runs to its end)"
            ) from None

    async def _after_success(self, ctx: Context) -> None:
        """What a success sets off, before its ack (a crash in between runs the
        job again, and each of these is idempotent): the ``after_success``
        hooks (the next workflow step, the batch's progress), then
        forgetting the job's checkpoint."""
        await self.app.middleware.after_success(ctx)
        if ctx.state.get("checkpointed"):
            await self.broker.kv_delete([keys.checkpoint(ctx.message.id)])

    def _unknown(self, msg: Message) -> UnknownTask:
        if msg.kind == "task":
            what = f"no task named {msg.name!r} is registered in this worker"
            near = did_you_mean(msg.name, self.app.tasks)
            if near:
                what += f" (did you mean {' or '.join(repr(n) for n in near)}?)"
        else:
            what = f"no handler of event {msg.name!r} for queue {msg.queue!r} in this worker"
        return UnknownTask(f"{what} (app {mask_url(self.app.url)}); replay it once one is")

    async def _admit(self, d: Delivery, name: str, flow: Flow, now: float) -> bool:
        """Take the job's concurrency slot and rate permit, or hold it back.

        A job over a limit is given back without charging its attempt, to run
        when a permit should be free: a rate limit says when; for a
        concurrency limit the task's recent run time is the guess.  Nothing
        polls.  Returns True when the job may start now (``d.started_at`` is
        the start time its rate permit was stamped with)."""
        assert d.message is not None
        base = f"{name}:{d.message.headers.get('limit_key', '')}"
        if flow.concurrency is not None:
            slot = keys.CONCURRENCY + base
            if not await self.broker.slot_acquire(slot, flow.concurrency, d.id, self.config.lease):
                guess = self._task_time.get(name, 1.0)
                d.retry_at = now + guess * random.uniform(1.0, 2.0)
                return self._held_back(d, "concurrency", base)
            d.holds.append((slot, d.id))
        if flow.rate is not None:
            n, per = flow.rate
            at = time.time()
            wait = await self.broker.rate_limit(keys.RATE + base, n, per, at)
            if wait > 0:
                if d.holds:
                    await self.broker.slot_release(d.holds)
                    d.holds.clear()
                # spread the held-back jobs over the window instead of all at once
                d.retry_at = at + wait + random.uniform(0.0, per / n)
                return self._held_back(d, "rate", base)
            d.started_at = at
        else:
            d.started_at = now
        return True

    def _held_back(self, d: Delivery, limit: str, key: str) -> bool:
        self.counts["throttled"] += 1
        log.debug("job %s held back by the %s limit of %s", d.id, limit, key)
        return False

    def _unstick(self, _fut: object) -> None:
        self._stuck -= 1
        self._slot.set()

    def _failed(self, d: Delivery, ctx: Context, task: Handler, exc: BaseException) -> str:
        msg = ctx.message
        if isinstance(exc, Reject):
            return self._dead(d, ctx, exc)
        if isinstance(exc, RetryLater):
            if msg.attempt >= msg.max_attempts:
                return self._dead(d, ctx, exc)
            return self._retry(d, ctx, exc, time.time() + exc.after)
        if task.retry.should_retry(exc, msg.attempt, msg.max_attempts):
            return self._retry(d, ctx, exc, time.time() + task.retry.wait(msg.attempt))
        return self._dead(d, ctx, exc)

    def _retry(self, d: Delivery, ctx: Context, exc: BaseException, at: float) -> str:
        d.error = error_record(exc, d, self.id)
        d.retry_at = at
        self.app.middleware.call("on_retry", ctx, d.error, at)
        return RETRY  # logged with the job's duration by _process

    def _dead(self, d: Delivery, ctx: Context | None, exc: BaseException) -> str:
        d.error = error_record(exc, d, self.id)
        self._dying[d.id] = ctx  # on_dead runs in _process, which awaits it
        # logged by _process: the message names its task even when no
        # handler ran (unknown task, arguments that no longer fit); only an
        # undecodable body has no name
        return DEAD


def did_you_mean(name: str, known: Iterable[str]) -> list[str]:
    """Registered task names close to ``name`` (a typo, a moved module), at
    most three: by the function's name (the last part: ``jobs.send_welcom``
    finds ``myproject.jobs.send_welcome`` and not its neighbour
    ``myproject.jobs.send_receipt``, which shares the long prefix), else by the
    whole name."""
    names = sorted(known)
    by_short: dict[str, list[str]] = {}
    for n in names:
        by_short.setdefault(n.rsplit(".", 1)[-1], []).append(n)
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], by_short, n=3, cutoff=0.75)
    found = [n for s in close for n in by_short[s]]
    if not found:
        return difflib.get_close_matches(name, names, n=3, cutoff=0.75)

    def likeness(n: str) -> float:
        return difflib.SequenceMatcher(None, name, n).ratio()

    return sorted(found, key=likeness, reverse=True)[:3]


def _call_kw(
    cv: contextvars.Context, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return cv.run(fn, *args, **kwargs)
