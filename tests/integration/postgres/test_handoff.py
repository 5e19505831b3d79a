"""The direct handoff (migration 0005): a job enqueued while a worker waits is
stored running for that worker and sent to it in the NOTIFY, so it starts
without a claim; and a handed job is never lost nor run twice, whatever
happens to the fetch, the LISTEN connection or the worker process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.broker import NOTIFY_MAX
from dumbwaiter.brokers.postgres.listen import INBOX_HOLD
from dumbwaiter.brokers.types import Binding
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually
from tests.conformance.test_events import event
from tests.integration.postgres import server
from tests.integration.postgres.test_counts import _counted, _sql, _stats

Make = Callable[..., PostgresBroker]
ROOT = Path(__file__).resolve().parents[3]


def _job(schema: str, job_id: str) -> tuple[Any, ...]:
    [row] = _sql(
        f"SELECT state, attempt, worker, token FROM \"{schema}\".dw_jobs WHERE id = '{job_id}'"
    )
    return row


def _waiters(schema: str) -> list[tuple[Any, ...]]:
    return _sql(f'SELECT token, worker, channel FROM "{schema}".dw_waiters')


async def _registered(schema: str, n: int = 1) -> list[tuple[Any, ...]]:
    """Wait until ``n`` fetches wait (their claims registered them)."""
    return await eventually(lambda: asyncio.to_thread(_waiters, schema), lambda w: len(w) >= n)


def _count_claims(broker: PostgresBroker) -> list[int]:
    """Count the claim statements ``broker`` sends from now on."""
    calls = [0]
    claim = broker._claim

    async def counted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return await claim(*args, **kw)

    broker._claim = counted  # type: ignore[method-assign]
    return calls


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _late_withdraw(broker: PostgresBroker) -> asyncio.Event:
    """Hold back the withdrawal of a cancelled fetch's wait until the event
    is set (so a producer can still hand it a job); set when the test ends."""
    gate = asyncio.Event()
    withdraw = broker._withdraw

    async def late_withdraw(*args: Any) -> None:
        try:
            await asyncio.wait_for(gate.wait(), 30)
        except TimeoutError:
            pass
        await withdraw(*args)

    broker._withdraw = late_withdraw  # type: ignore[method-assign, assignment]
    return gate


@pytest.mark.parametrize("producer_side", ["async", "sync"])
async def test_a_job_enqueued_while_a_worker_waits_starts_without_a_claim(
    make_broker: Make, producer_side: str
) -> None:
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, worker, _)] = await _registered(consumer.schema)
    assert worker == "w1"
    claims = _count_claims(consumer)
    m = msg(args=[42], kwargs={"name": "Zoë"})
    if producer_side == "async":
        await producer.enqueue([m])
    else:
        await asyncio.to_thread(producer.enqueue_sync, [m])
    # stored already running for the waiting worker, before it did anything
    assert _job(consumer.schema, m.id) == ("running", 1, "w1", token)
    [d] = await asyncio.wait_for(waiting, 10)
    assert claims[0] == 0  # the NOTIFY brought it: no claim
    assert d.id == m.id and d.token == token and d.queue == "default"
    assert d.message is not None and d.message.attempt == 1 and d.message.errors == []
    assert (d.message.args, d.message.kwargs) == ([42], {"name": "Zoë"})
    assert d.lease_until > time.time() + 20
    assert _waiters(consumer.schema) == []  # taken: nobody else gets it
    assert await _stats(consumer) == _counted(consumer.schema) == {("default", "running"): 1}
    await consumer.ack([d])  # the token it came with holds the lease
    assert _job(consumer.schema, m.id)[0] == "succeeded"
    assert await _stats(consumer) == _counted(consumer.schema) == {("default", "succeeded"): 1}


async def test_an_event_for_one_waiting_group_is_handed(make_broker: Make) -> None:
    consumer, producer = make_broker(), make_broker()
    await producer.declare([], [Binding("order.created", "group:email", 3)])
    waiting = asyncio.create_task(consumer.fetch(["group:email"], 10, 30.0, 60.0, "w1"))
    [(token, _, _)] = await _registered(consumer.schema)
    claims = _count_claims(consumer)
    assert await producer.publish([event(order_id="o-1")]) == 1
    [d] = await asyncio.wait_for(waiting, 10)
    assert claims[0] == 0 and d.token == token
    assert d.message is not None and d.message.payload == {"order_id": "o-1"}
    assert d.message.max_attempts == 3 and d.message.attempt == 1
    await consumer.ack([d])
    assert await _stats(consumer) == _counted(consumer.schema)


async def test_a_scheduled_job_or_a_job_of_a_paused_queue_is_not_handed(
    make_broker: Make,
) -> None:
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    await producer.pause("paused")
    waiting = asyncio.create_task(consumer.fetch(["default", "paused"], 10, 30.0, 60.0, "w1"))
    await _registered(consumer.schema)
    later = msg(eta=time.time() + 3600)
    await producer.enqueue([later])
    assert _job(consumer.schema, later.id)[:2] == ("scheduled", 0)
    paused = msg(queue="paused")
    await producer.enqueue([paused])
    assert _job(consumer.schema, paused.id)[:2] == ("ready", 0)
    # its wake-up made the fetch claim (nothing: paused) and wait again
    await _registered(consumer.schema)
    assert not waiting.done()
    await _cancel(waiting)
    assert _job(consumer.schema, paused.id)[:2] == ("ready", 0)
    assert await _stats(consumer) == _counted(consumer.schema)


async def test_a_job_behind_ready_ones_keeps_its_place(make_broker: Make) -> None:
    """A queue with a ready job hands nothing: priority and FIFO order hold
    (a waiter may exist when a ready job was not seen by its claim)."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    await producer.enqueue([old := msg()])
    jobs = f'"{consumer.schema}".dw_jobs'
    _sql(f"UPDATE {jobs} SET state = 'running' WHERE id = '{old.id}'")
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, _, _)] = await _registered(consumer.schema)
    _sql(f"UPDATE {jobs} SET state = 'ready' WHERE id = '{old.id}'")  # no NOTIFY
    producer._no_waiter.clear()  # offer it (its queue found no waiter a moment ago)
    behind = msg(priority=9)
    await producer.enqueue([behind])
    # not handed: its wake-up made the fetch claim both, in priority order
    ds = await asyncio.wait_for(waiting, 10)
    assert [d.id for d in ds] == [behind.id, old.id]
    assert {d.token for d in ds} != {token}


async def test_a_job_too_big_for_a_notify_is_claimed_as_before(make_broker: Make) -> None:
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, _, _)] = await _registered(consumer.schema)
    claims = _count_claims(consumer)
    m = msg(args=["x" * NOTIFY_MAX])
    await producer.enqueue([m])
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id and d.message is not None and d.message.args == ["x" * NOTIFY_MAX]
    assert claims[0] == 1 and d.token != token  # stored ready, then claimed


async def test_a_job_whose_id_is_stored_wakes_its_waiter_to_claim(make_broker: Make) -> None:
    """A producer sending again (its reply was lost) takes a waiter but stores
    nothing: the waiter is told so and claims, rather than sleep to its end."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    await producer.enqueue([m := msg(queue="other")])
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, _, _)] = await _registered(consumer.schema)
    claims = _count_claims(consumer)
    again = msg()
    again.id = m.id
    await producer.enqueue([again])  # same id: not stored, the waiter was taken
    assert _job(consumer.schema, m.id)[0] == "ready"
    # the claim the token-only NOTIFY prompts registers the fetch again
    await eventually(
        lambda: asyncio.to_thread(_waiters, consumer.schema),
        lambda w: len(w) == 1 and w[0][0] != token,
    )
    assert claims[0] == 1 and not waiting.done()
    await _cancel(waiting)


async def _a_cancelled_wait(consumer: PostgresBroker) -> tuple[asyncio.Event, Any]:
    """A fetch of worker w1 that registered its wait and was cancelled, its
    withdrawal held back (see _late_withdraw): a producer can still hand it
    a job.  Returns the gate and the wait's token."""
    gate = _late_withdraw(consumer)
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, _, _)] = await _registered(consumer.schema)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    return gate, token


async def test_a_job_handed_to_a_cancelled_fetch_runs_once(make_broker: Make) -> None:
    """Handed after its fetch gave up: the next fetch of the process takes it
    (no claim), and nothing else ever gets it."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    gate, token = await _a_cancelled_wait(consumer)
    m = msg()
    await producer.enqueue([m])
    assert _job(consumer.schema, m.id) == ("running", 1, "w1", token)
    listener = consumer._state().listener
    await eventually(lambda: asyncio.sleep(0, listener.inbox), lambda box: len(box) == 1)
    claims = _count_claims(consumer)
    [d] = await consumer.fetch(["default"], 10, 30.0, 60.0, "w1")
    assert claims[0] == 0 and d.id == m.id and d.token == token
    gate.set()
    await asyncio.gather(*consumer._state().giving_back)
    assert await consumer.fetch(["default"], 10, 30.0, 0) == []
    assert await producer.fetch(["default"], 10, 30.0, 0) == []
    await consumer.ack([d])
    assert _job(consumer.schema, m.id)[:2] == ("succeeded", 1)


async def test_a_handed_job_nobody_takes_is_given_back_uncharged(make_broker: Make) -> None:
    """In the inbox past INBOX_HOLD (its worker is busy): back to ready,
    attempt 0, for any worker; no lease runs out on it."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    gate, _ = await _a_cancelled_wait(consumer)
    m = msg()
    await producer.enqueue([m])
    assert _job(consumer.schema, m.id)[:2] == ("running", 1)
    state = await eventually(
        lambda: asyncio.to_thread(_job, consumer.schema, m.id),
        lambda row: row[0] == "ready",
        timeout=INBOX_HOLD + 10,
    )
    assert state[:2] == ("ready", 0)
    [d] = await producer.fetch(["default"], 10, 30.0, 0)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1
    assert d.message.errors == []
    assert consumer._state().listener.inbox == []
    gate.set()


async def test_a_handed_job_in_the_inbox_goes_back_when_the_broker_closes(
    make_broker: Make,
) -> None:
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    gate, _ = await _a_cancelled_wait(consumer)
    m = msg()
    await producer.enqueue([m])
    listener = consumer._state().listener
    await eventually(lambda: asyncio.sleep(0, listener.inbox), lambda box: len(box) == 1)
    gate.set()
    await consumer.close()
    assert _job(consumer.schema, m.id)[:2] == ("ready", 0)
    [d] = await producer.fetch(["default"], 10, 30.0, 0)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1


async def test_a_handed_job_whose_notify_was_lost_is_adopted(make_broker: Make) -> None:
    """The LISTEN connection is ended with a handed job in flight: the claim
    made when the listener comes back adopts the job, once."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    [(token, _, channel)] = await _registered(consumer.schema)
    listener = consumer._state().listener
    assert channel == listener.hand_channel
    pid = listener._conn.info.backend_pid  # type: ignore[union-attr]
    # the handoff's NOTIFY is lost as if it had been sent as the listener died
    _sql(f"UPDATE \"{consumer.schema}\".dw_waiters SET channel = 'dw_hand_nobody'")
    m = msg()
    await producer.enqueue([m])
    assert _job(consumer.schema, m.id) == ("running", 1, "w1", token)
    assert not waiting.done()
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id and d.token == token
    assert d.message is not None and d.message.attempt == 1
    assert token not in listener.pending
    assert await consumer.fetch(["default"], 10, 30.0, 0.2, "w1") == []
    assert await producer.fetch(["default"], 10, 30.0, 0) == []
    await consumer.ack([d])
    assert _job(consumer.schema, m.id)[:2] == ("succeeded", 1)


async def test_a_notify_that_comes_after_the_adoption_is_ignored(make_broker: Make) -> None:
    """Adopted by a claim first, then its NOTIFY arrives: not delivered twice."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0, "w1"))
    await _registered(consumer.schema)
    listener = consumer._state().listener
    _sql(f"UPDATE \"{consumer.schema}\".dw_waiters SET channel = 'dw_hand_nobody'")
    m = msg()
    await producer.enqueue([m])
    listener.wake(None)  # as the listener does when it comes back
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id
    # now the NOTIFY, late
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        payload = _sql(
            "SELECT json_build_array(token, id::text, queue,"
            " date_part('epoch', lease_until))::text || chr(10) || convert_from(body, 'UTF8')"
            f' FROM "{consumer.schema}".dw_jobs'
        )[0][0]
        conn.execute("SELECT pg_notify(%s, %s)", (listener.hand_channel, payload))
    assert await consumer.fetch(["default"], 10, 30.0, 0.3, "w1") == []
    assert listener.inbox == []


_WORKER = """
import asyncio, sys
from dumbwaiter.worker import Worker
from tests.crash.crashapp import app
asyncio.run(Worker(app, fetch_wait=float(sys.argv[1]), lease=3.0, heartbeat=1.0,
                   concurrency=1, rescue_interval=0.2).run())
"""


def test_a_job_handed_to_a_worker_killed_while_waiting_runs_elsewhere(
    schema: str, tmp_path: Path
) -> None:
    """SIGKILL of the process a job was handed to: its lease runs out and
    another worker runs it (once)."""
    from tests.crash import crashapp

    url = server.url(schema)
    log = tmp_path / "started.log"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**os.environ, "DW_CRASH_URL": url, "DW_CRASH_LOG": str(log), "PYTHONPATH": path}
    import dumbwaiter as dw

    app = dw.App(url)
    work = app.task(name="crash.work")(crashapp.work.fn)
    assert isinstance(app.broker, PostgresBroker)
    app.broker.open_sync()  # the schema (migrate=auto) before anyone looks for it
    first = subprocess.Popen([sys.executable, "-c", _WORKER, "60"], cwd=ROOT, env=env)
    second: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while not _waiters(schema):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # it cannot start what it is handed
        job = work.enqueue(1)
        state, attempt, worker, _ = _job(schema, job.id)
        assert (state, attempt) == ("running", 1) and worker
        first.kill()
        first.wait(timeout=30)
        second = subprocess.Popen([sys.executable, "-c", _WORKER, "1"], cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while _job(schema, job.id)[0] != "succeeded":
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        [line] = log.read_text().splitlines()
        assert line == f"{job.id} {second.pid} 2"  # the lease ran out: attempt 2
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        app.close()
