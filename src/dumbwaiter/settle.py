"""A worker's outcomes: what an attempt records on its delivery (the error
of a failed one, the result record of a successful one) and how outcomes
reach the broker.

The ``Settler`` writes them in batches (group commit): while one batch of
acks is written, the next collects, so a busy worker makes few broker calls
and an idle one adds no delay.  Before an event's ack it marks the event
handled in the broker-side inbox (``inbox_key``, worked out at fetch), so a
redelivery after a crash between the two is recognised as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from . import keys
from .cancel import CANCEL_PREFIX
from .errors import SerializationError
from .message import ErrorRecord, check_json
from .ports import Runtime

if TYPE_CHECKING:
    from .brokers.types import Delivery
    from .event import Subscription
    from .task import Task

# the worker's lines, under the logger people configure for it
log = logging.getLogger("dumbwaiter.worker")

ACK, RETRY, DEAD, REQUEUE = "ack", "retry", "dead", "requeue"
#: a job someone asked to stop while it ran (``dumbwaiter.cancel``)
CANCEL = "cancel"


def inbox_key(d: Delivery) -> str | None:
    """The broker-side inbox entry of an event delivery: its group's queue and
    the event's id (None for tasks, and for replays forced past the inbox)."""
    m = d.message
    if m is None or m.kind != "event" or m.headers.get("inbox") == "skip":
        return None
    return inbox_entry(m.queue, str(m.headers.get("event_id") or m.id))


def inbox_entry(queue: str, event_id: str) -> str:
    """The kv key that marks event ``event_id`` handled by the group of ``queue``
    (the dashboard's events page reads them too)."""
    return keys.inbox(queue, event_id)


def error_record(exc: BaseException, d: Delivery, worker: str) -> ErrorRecord:
    t = type(exc)
    module = t.__module__
    name = t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"
    tb = "".join(traceback.format_exception(exc)) if exc.__traceback__ is not None else ""
    return ErrorRecord(
        time=time.time(),
        type=name,
        message=str(exc),
        traceback=tb[-8000:],
        worker=worker,
        attempt=d.message.attempt if d.message is not None else 0,
        started=d.started_at,
    )


def result_record(result: Any, task: Task[..., Any] | Subscription, started: float) -> bytes:
    """The record of a successful attempt the broker keeps with the job: when
    it started and finished (its duration, on the dashboard), and its result
    (``value``) when the task keeps results (``JobInfo.outcome``)."""
    timing = {"started": started, "finished": time.time()}
    if task.keep_result is None:
        return orjson.dumps(timing)
    try:
        check_json(result, f"the result of {task.name}()")
    except SerializationError as exc:
        log.error("%s; it is not stored", exc)
        return orjson.dumps({"error": str(exc), **timing})
    return orjson.dumps({"value": result, **timing})


class Settler:
    """Writes outcomes to the broker in batches (group commit); counts them
    in ``counts`` (the worker's) once written."""

    def __init__(self, app: Runtime, counts: dict[str, int]) -> None:
        self.app = app
        self.broker = app.broker
        self.counts = counts
        self.pending: dict[str, list[Delivery]] = {
            ACK: [],
            RETRY: [],
            DEAD: [],
            REQUEUE: [],
            CANCEL: [],
        }
        self._wake = asyncio.Event()
        self._closing = False
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, kind: str, d: Delivery) -> None:
        self.pending[kind].append(d)
        self.idle.clear()
        self._wake.set()

    async def run(self) -> None:
        broker = self.broker
        calls: dict[str, Callable[[Sequence[Delivery]], Awaitable[None]]] = {
            ACK: broker.ack,
            RETRY: broker.retry,
            DEAD: broker.dead,
            REQUEUE: broker.requeue,
            CANCEL: self._cancelled,
        }
        counter = {ACK: "succeeded", RETRY: "retried", DEAD: "dead", REQUEUE: "requeued"}
        counter[CANCEL] = "cancelled"
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            for kind, call in calls.items():
                batch = self.pending[kind]
                if not batch:
                    continue
                self.pending[kind] = []
                try:
                    if kind == ACK:
                        await self._mark_inbox(batch)
                    await call(batch)
                    holds = [h for d in batch for h in d.holds]
                    if holds:
                        await broker.slot_release(holds)
                    backoff = 0.05
                except Exception:
                    # keep them: the broker may be back in a moment; if not,
                    # their leases expire and they run again elsewhere
                    log.exception("could not record %d %s outcome(s); retrying", len(batch), kind)
                    self.pending[kind] = batch + self.pending[kind]
                    self._wake.set()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                self.counts[counter[kind]] += len(batch)
            if not any(self.pending.values()):
                self.idle.set()
                if self._closing:
                    return

    async def _mark_inbox(self, batch: list[Delivery]) -> None:
        """Record handled events before their ack: if we die between the two,
        the redelivery is recognised as a duplicate."""
        marks = {k: b"1" for d in batch if (k := d.inbox) is not None and not d.duplicate}
        if marks:
            await self.broker.kv_set(marks, ttl=self.app.event_retention)

    async def _cancelled(self, ds: Sequence[Delivery]) -> None:
        done = await self.broker.cancel_running(ds)
        # a job not cancelled runs elsewhere (its lease was lost): its request stays
        await self.broker.kv_delete([CANCEL_PREFIX + i for i in done])
        if done:
            log.info(
                "cancelled %d job(s) on request: %s",
                len(done),
                ", ".join(done),
                extra={"action": "cancelled"},
            )

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), timeout=30)
