"""Floors for pickup on NATS JetStream: bare nats-py workers in the peers harness.

Two configurations, both a durable pull consumer fetching one message per
pull request (as taskiq-nats' ``PullBasedJetStreamBroker`` does), the task
started on its own asyncio task, the message acked after it (uvloop):

* ``nats-bare-pull``: pull, run, ack: what taskiq-nats does without taskiq;
* ``nats-bare-claim``: pull, then a compare-and-set write of a record for
  the job (a publish with ``Nats-Expected-Last-Subject-Sequence: 0`` to a
  stream with one message per subject) and its PubAck awaited before the
  task starts: the one round trip dumbwaiter-nats' claim (its fencing
  token, docs/nats.md "How a job moves") adds between a delivery and the
  job's start, and nothing else.

So W3 run for both next to dumbwaiter-nats and taskiq-nats shows, in the
same minute, how much of a gap to taskiq-nats is the claim's round trip.
The producer is ``await js.publish`` (PubAcked), like the other NATS adapters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import nats.errors as nats_errors
from peers import tasks
from peers.adapters.base import Adapter
from peers.common import nats_connect, nats_consumer_pending, nats_delete_streams

JOBS = "BARE_JOBS"
RECS = "BARE_RECS"
SUBJECT = "bare.jobs"
DURABLE = "bare_durable"


async def _streams(js: object) -> None:
    from nats.js.api import StreamConfig

    add = js.add_stream  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        await add(StreamConfig(name=JOBS, subjects=[SUBJECT]))
    with contextlib.suppress(Exception):
        await add(StreamConfig(name=RECS, subjects=["bare.rec.>"], max_msgs_per_subject=1))


async def _work(claim: bool, concurrency: int) -> None:
    nc = await nats_connect()
    js = nc.jetstream()
    await _streams(js)
    psub = await js.pull_subscribe(SUBJECT, DURABLE, stream=JOBS)
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()
    seq = 0

    async def run(msg: object, task: str, i: int) -> None:
        try:
            if task == "noop":
                await tasks.anoop(i)
            else:
                await tasks.asleep10ms(i)
            await msg.ack()  # type: ignore[attr-defined]
        finally:
            slots.release()

    while True:
        await slots.acquire()
        try:
            msgs = await psub.fetch(1, timeout=5.0)
        except (TimeoutError, nats_errors.TimeoutError):
            slots.release()
            continue
        for msg in msgs:
            task, _, i = msg.data.decode().partition(" ")
            if claim:
                seq += 1
                await js.publish(
                    f"bare.rec.{seq}.{i}",
                    b"running",
                    stream=RECS,
                    headers={"Nats-Expected-Last-Subject-Sequence": "0"},
                )
            t = asyncio.create_task(run(msg, task, int(i)))
            running.add(t)
            t.add_done_callback(running.discard)


class NatsBareAdapter(Adapter):
    dists = ("nats-py",)
    backend = "nats"
    is_async = True
    default_concurrency = 100
    bulk = "none"

    def __init__(self, claim: bool) -> None:
        self.claim = claim
        self.name = "nats-bare-claim" if claim else "nats-bare-pull"
        self.notes = (
            "bare nats-py: pull one message per request, "
            + ("a compare-and-set record write (PubAcked), " if claim else "")
            + "run, ack (a floor, not a library)"
        )
        self.nc: object = None
        self.js: object = None

    async def open(self) -> None:
        self.nc = await nats_connect()
        self.js = self.nc.jetstream()  # type: ignore[attr-defined]
        await _streams(self.js)

    async def close(self) -> None:
        await self.nc.close()  # type: ignore[attr-defined]

    async def enqueue_one(self, task: str, i: int) -> None:
        await self.js.publish(SUBJECT, f"{task} {i}".encode(), stream=JOBS)  # type: ignore[attr-defined]

    def reset(self) -> None:
        nats_delete_streams(JOBS, RECS)

    def pending(self) -> int | None:
        return nats_consumer_pending(JOBS, DURABLE)

    def worker_cmd(self, concurrency: int) -> list[str]:
        return [self.py(), "-m", "nats_bare_adapter", "--work",
                "claim" if self.claim else "pull", "-c", str(concurrency)]  # fmt: skip


ADAPTERS: list[Adapter] = [NatsBareAdapter(False), NatsBareAdapter(True)]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--work", choices=("pull", "claim"), required=True)
    p.add_argument("-c", type=int, default=100)
    a = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_work(a.work == "claim", a.c))
