"""A producer killed between a job's record and its copy (issue 18.5 on Kafka).

An enqueue writes the job's record in the state store while its copy is
sent to the queue's topic.  A producer SIGKILLed after the record and before
the copy (the cluster unreachable, its send still trying) leaves a
``ready`` record that no copy will ever bring to a worker: listed for ever
with a growing lag, as RabbitMQ's were.  The
broker's reconcile (``stranded=`` seconds) writes the copy again, so each
job runs, once, within a bounded time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import dumbwaiter as dw
from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.message import uuid7
from dumbwaiter.state import State
from tests.conformance.helpers import eventually
from tests.integration.kafka.server import new_prefix, url
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_url

ROOT = Path(__file__).resolve().parents[3]

_PRODUCER_IN_AN_OUTAGE = """
import asyncio, sys, time
from dumbwaiter.brokers import from_url
from dumbwaiter.message import TASK, Message

async def main() -> None:
    b = from_url(sys.argv[1])
    await b.open()
    await b.declare(["default"])

    class Unreachable:  # the cluster is down: the copies never leave
        def abandon(self):
            pass

        async def wait(self):  # the records were written meanwhile
            print("written", flush=True)
            await asyncio.Event().wait()

    async def unreachable(items):
        return Unreachable()

    b.start_send = unreachable
    ms = [Message(id=i, kind=TASK, name="t.job", queue="default", created_at=time.time(),
                  max_attempts=4) for i in sys.argv[2:]]
    await b.enqueue(ms)

asyncio.run(main())
"""


async def test_a_producer_killed_before_the_copy_leaves_records_that_still_run(
    tmp_path: Path,
) -> None:
    ids = [uuid7(), uuid7()]
    the_url = url(new_prefix(), redis_url(redis_prefix()), session_timeout="2", stranded="1")
    script = tmp_path / "producer.py"
    script.write_text(_PRODUCER_IN_AN_OUTAGE)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # this checkout's code
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), the_url, *ids, stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
    finally:
        proc.kill()
        await proc.wait()
    assert line.strip() == b"written"

    app = dw.App(the_url)
    ran: list[str] = []

    @app.task(name="t.job")
    def work(ctx: dw.Context) -> None:
        ran.append(ctx.job_id)

    admin = app.broker
    assert isinstance(admin, KafkaBroker)

    async def states() -> list[State | None]:
        infos = [await admin.get(i) for i in ids]
        return [None if info is None else info.state for info in infos]

    try:
        await admin.open()
        assert await states() == [State.READY] * 2  # records, and no copy to run them
        worker = dw.Worker(app, queues=("default",), concurrency=2, fetch_wait=0.2)
        run = asyncio.ensure_future(worker.run())
        try:
            await eventually(states, lambda st: st == [State.SUCCEEDED] * 2, timeout=60)
        finally:
            worker.stop()
            await run
        assert sorted(ran) == sorted(ids)  # each once
    finally:
        await app.aclose()
