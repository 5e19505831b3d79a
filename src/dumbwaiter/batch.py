"""Batch jobs: shard large work into jobs, track it, resume it, checkpoint it.

``app.batch(settle, orders, chunk_size=1000)`` reads ``orders`` (any
iterable, consumed lazily: 100 million rows never sit in memory) and enqueues
one shard job per chunk, ``settle(items)``; a ``range`` is cut into
``settle(start, stop)`` shards instead, so a key range travels as two
numbers.  Shard jobs have ids derived from the batch id and their index.

Progress lives in the broker: the shards that succeeded and those that died
(``dumbwaiter batches ls | show``).  When every shard has an outcome,
``on_complete`` runs once if all succeeded, else ``on_failure`` once (each
under a derived id).  Running ``app.batch(..., batch_id=...)`` again with the
same items resumes the batch: shards that succeeded are skipped, dead ones
are replayed, missing ones (the producer died while enqueuing) are enqueued,
and queued or running ones are left alone.

The worker knows nothing of batches: ``lifecycle.BatchShards``, a
middleware the App registers, counts each shard when it succeeded
(``after_success``) or died or was cancelled (``on_dead``,
``on_cancelled``), before the outcome is stored; a shard the rescuer buried
(its worker lost on its last attempt) counts too.

A long shard can ``ctx.checkpoint(state)`` (or ``await ctx.acheckpoint``);
when it is retried, ``ctx.load_checkpoint()`` returns the last state, so it
continues instead of starting over.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

from . import keys
from .brokers.types import JobFilter
from .errors import ConfigurationError
from .message import Message, uuid7
from .state import State
from .workflow import Signature, derived_id

if TYPE_CHECKING:
    from .ports import Runtime, TaskRef

#: batch records and progress are kept this long (seconds): 7 days
BATCH_TTL = 7 * 86400.0
#: shard jobs enqueued per broker call
ENQUEUE_CHUNK = 500


def _key(bid: str, part: str = "") -> str:
    """``batches:ID`` is a batch's record; ``batch:ID:ok`` / ``:failed`` its sets."""
    return f"{keys.BATCH_SHARDS}{bid}:{part}" if part else keys.BATCH_RECORD + bid


def _shards(items: Iterable[Any], size: int) -> Iterator[tuple[tuple[Any, ...], int]]:
    """(arguments, item count) of each shard, read lazily."""
    if isinstance(items, range):
        if items.step != 1:
            raise ConfigurationError("batch over a range needs step 1")
        for start in range(items.start, items.stop, size):
            stop = min(start + size, items.stop)
            yield (start, stop), stop - start
        return
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield (chunk,), len(chunk)


async def start(
    app: Runtime,
    task: TaskRef,
    items: Iterable[Any],
    *,
    chunk_size: int,
    on_complete: Signature | None = None,
    on_failure: Signature | None = None,
    batch_id: str | None = None,
    name: str | None = None,
) -> Batch:
    """Shard ``items`` into jobs of ``task`` (see the module docstring)."""
    if chunk_size < 1:
        raise ConfigurationError("chunk_size must be at least 1")
    b = app.broker
    bid = batch_id or uuid7()
    resuming = batch_id is not None
    done = await b.kv_smembers(_key(bid, "ok")) if resuming else set()
    record = {
        "id": bid,
        "name": name or task.name,
        "task": task.name,
        "chunk_size": chunk_size,
        "created_at": time.time(),
        "total": None,
        "items": None,
        "on_complete": None if on_complete is None else on_complete.to_json(),
        "on_failure": None if on_failure is None else on_failure.to_json(),
    }
    await b.kv_set({_key(bid): orjson.dumps(record)}, ttl=BATCH_TTL)
    total = items_total = 0
    pending: list[Message] = []
    for index, (args, count) in enumerate(_shards(items, chunk_size)):
        total += 1
        items_total += count
        if str(index) in done:
            continue
        msg = task.message(args, {})
        msg.id = derived_id(bid, str(index))
        msg.headers["batch"] = {"id": bid, "i": index}
        pending.append(msg)
        if len(pending) >= ENQUEUE_CHUNK:
            await _flush(app, pending, resuming)
            pending = []
    if pending:
        await _flush(app, pending, resuming)
    record.update(total=total, items=items_total)
    await b.kv_set({_key(bid): orjson.dumps(record)}, ttl=BATCH_TTL)
    batch = Batch(app, bid)
    await batch.check_done()  # every shard may have finished while we enqueued
    return batch


async def _flush(app: Runtime, msgs: list[Message], resuming: bool) -> None:
    await app._send(msgs)
    if resuming:  # shards that died last time run again, with fresh attempts
        await app.broker.replay(JobFilter(ids=tuple(m.id for m in msgs), state=State.DEAD))


async def shard_done(app: Runtime, msg: Message, ok: bool) -> None:
    """A shard succeeded (``ok``) or died: record it and maybe finish the batch."""
    info = msg.headers["batch"]
    bid, index = str(info["id"]), str(info["i"])
    await app.broker.kv_sadd(_key(bid, "ok" if ok else "failed"), index, ttl=BATCH_TTL)
    await Batch(app, bid).check_done()


class Batch:
    """The handle of a batch: progress, and its callbacks fired once."""

    def __init__(self, app: Runtime, id: str) -> None:
        self.app = app
        self.id = id

    def __repr__(self) -> str:
        return f"<Batch {self.id}>"

    async def arecord(self) -> dict[str, Any] | None:
        raw = (await self.app.broker.kv_get([_key(self.id)])).get(_key(self.id))
        return None if raw is None else dict(orjson.loads(raw))

    async def aprogress(self) -> dict[str, Any]:
        """``total`` shards (None while enqueuing), ``done``, ``failed`` (dead
        and not succeeded since), ``pending``, and the batch's record."""
        record = await self.arecord() or {}
        b = self.app.broker
        ok = await b.kv_smembers(_key(self.id, "ok"))
        failed = await b.kv_smembers(_key(self.id, "failed")) - ok
        total = record.get("total")
        return {
            **record,
            "id": self.id,
            "done": len(ok),
            "failed": len(failed),
            "pending": None if total is None else total - len(ok) - len(failed),
            "state": _state(total, len(ok), len(failed)),
        }

    def progress(self) -> dict[str, Any]:
        return self.app._call(self.aprogress())

    async def check_done(self) -> None:
        """Fire ``on_complete`` / ``on_failure`` when every shard has an outcome
        (idempotent: the callback's id is derived from the batch's)."""
        p = await self.aprogress()
        if p["total"] is None or p["pending"] != 0:
            return
        which = "on_complete" if p["failed"] == 0 else "on_failure"
        step = p.get(which)
        if step is None:
            return
        task = self.app.tasks.get(step["t"])
        if task is None:
            raise ConfigurationError(f"batch callback {step['t']!r} is not a task of this app")
        summary = {k: p[k] for k in ("id", "name", "total", "done", "failed", "items")}
        args = ([summary] if step["p"] else []) + list(step["a"])
        msg = task.message(tuple(args), dict(step["k"]))
        msg.id = derived_id(self.id, which)
        await self.app._send([msg])


def _state(total: int | None, done: int, failed: int) -> str:
    if total is None:
        return "enqueuing"
    if done == total:
        return "complete"
    if done + failed == total:
        return "failed"
    return "running"


async def list_batches(app: Runtime) -> list[dict[str, Any]]:
    """Every batch kept in the broker, newest first, with its progress."""
    found = await app.broker.kv_scan(keys.BATCH_RECORD)
    ids = sorted((k.split(":", 1)[1] for k in found), reverse=True)
    return [await Batch(app, i).aprogress() for i in ids]
