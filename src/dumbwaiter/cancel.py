"""Cancelling a job, also while it runs (cooperatively).

A job that has not started is cancelled by the broker at once
(``Broker.cancel``).  A running job cannot be taken from its worker, which
may be another process on another host: the request is written to the
broker's key-value store (``cancel:ID``), which every process shares.  Each
worker reads the requests once per heartbeat (one ``kv_scan`` of the
prefix, whatever it runs: nothing is read per job), and for each of its jobs
that has one:

* a job fetched but not started yet ends ``cancelled`` without running;
* a running job's ``ctx.cancelled`` becomes True and
  ``ctx.raise_if_cancelled()`` raises ``JobCancelled``.  The handler decides
  where it is safe to stop; nothing interrupts it (a sync handler's thread
  cannot be interrupted, and an async handler is not cancelled at an await
  either, so both kinds stop at the same, chosen, points).  If it returns
  normally, the job succeeded (its work is done); if it raises anything,
  the job ends ``cancelled``: no retry, no dead letter.

The request expires after ``CANCEL_TTL`` if no worker ever sees it (the job
ended first).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import keys
from .message import dumps, loads
from .state import State

if TYPE_CHECKING:
    from .brokers.base import Broker
    from .brokers.types import JobInfo
    from .context import Context

#: kv prefix of the requests to cancel running jobs: ``cancel:JOB_ID``
CANCEL_PREFIX = keys.CANCEL
#: seconds a request waits for a worker to see it: longer than a retry's wait,
#: so a job that failed just as it was asked to stop is stopped at its next attempt
CANCEL_TTL = 86400.0

#: ``request_cancel``'s answer per id
CANCELLED, REQUESTED = "cancelled", "requested"


async def request_cancel(broker: Broker, ids: Sequence[str], by: str) -> dict[str, str]:
    """Cancel jobs not started; ask the workers of running ones to stop them.

    Returns, per id: ``"cancelled"``, ``"requested"`` (it runs: its handler
    sees ``ctx.cancelled`` within a heartbeat), or why neither (``"not
    found"``, ``"already cancelled"``, ``"already finished (succeeded)"``...).
    """
    ids = list(dict.fromkeys(ids))
    out = {i: CANCELLED for i in await broker.cancel(ids)}
    infos = {i: await broker.get(i) for i in ids if i not in out}
    running = [i for i, info in infos.items() if info is not None and info.state is State.RUNNING]
    if running:
        value = dumps({"at": time.time(), "by": by})
        await broker.kv_set({CANCEL_PREFIX + i: value for i in running}, ttl=CANCEL_TTL)
        # given back (shutdown, a limit) between the read and the write: cancel it now
        for i in await broker.cancel(running):
            out[i] = CANCELLED
        stale = []
        for i in running:
            if i in out:
                stale.append(i)
                continue
            info = await broker.get(i)
            if info is not None and info.state is State.RUNNING:
                out[i] = REQUESTED
            else:  # it ended meanwhile: a request left behind would stop a replay of it
                stale.append(i)
                infos[i] = info
        if stale:
            await broker.kv_delete([CANCEL_PREFIX + i for i in stale])
    for i, info in infos.items():
        out.setdefault(i, why_not(info))
    return {i: out[i] for i in ids}


def why_not(info: JobInfo | None) -> str:
    """Why a job could not be cancelled (``info``: what ``get`` returned)."""
    if info is None:
        return "not found"
    if info.state is State.CANCELLED:
        return "already cancelled"
    if info.state is State.RUNNING:
        return "running; try again"
    if info.state in (State.SUCCEEDED, State.DEAD):
        return f"already finished ({info.state})"
    return f"it is {info.state}, but changed while cancelling; try again"


async def pending(broker: Broker, ids: Sequence[str]) -> dict[str, dict[str, object]]:
    """The cancel requests of those ``ids`` that have one: id -> {"at", "by"}."""
    got = await broker.kv_get([CANCEL_PREFIX + i for i in ids])
    return {k.removeprefix(CANCEL_PREFIX): _decode(v) for k, v in got.items()}


def _decode(raw: bytes) -> dict[str, object]:
    try:
        value = loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class Cancels:
    """A worker's side: which of its jobs were asked to stop.

    ``poll`` (each heartbeat) reads every request; the worker's own jobs
    among them are remembered and their contexts flagged.  ``end`` turns
    such a job's failure (or its being given back) into a cancellation."""

    requested: set[str] = field(default_factory=set)
    contexts: dict[str, Context] = field(default_factory=dict)
    #: jobs that succeeded after a request: their requests are deleted at the next poll
    answered: list[str] = field(default_factory=list)

    async def poll(self, broker: Broker, mine: Sequence[str]) -> list[str]:
        """Read the requests; return the ids of ``mine`` newly asked to stop."""
        if self.answered:
            done, self.answered = self.answered, []
            await broker.kv_delete([CANCEL_PREFIX + i for i in done])
        if not mine:
            return []
        asked = await broker.kv_scan(CANCEL_PREFIX)
        if not asked:
            return []
        new = [i for i in mine if CANCEL_PREFIX + i in asked and i not in self.requested]
        for i in new:
            self.requested.add(i)
            ctx = self.contexts.get(i)
            if ctx is not None:
                ctx._request_cancel()
        return new

    def attach(self, job_id: str, ctx: Context) -> None:
        """The job's handler is about to run with ``ctx``."""
        self.contexts[job_id] = ctx
        if job_id in self.requested:
            ctx._request_cancel()

    def end(self, job_id: str, kind: str, success: str, cancel: str) -> tuple[str, Context | None]:
        """The job ended as ``kind``: forget its context (returned with the
        kind), and make the kind ``cancel`` if it was asked to stop and did
        not succeed."""
        ctx = self.contexts.pop(job_id, None)
        if job_id in self.requested:
            self.requested.discard(job_id)
            if kind != success:
                return cancel, ctx
            self.answered.append(job_id)
        return kind, ctx
