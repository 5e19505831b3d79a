"""What only the RabbitMQ broker does: the delay cascade's routing, the DLQ
with its error history, topic fan-out with patterns, quorum queues, a state
store on another engine, and the lease mapping (hung and crashed workers)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import aiormq
import orjson
import pytest
from pamqp import commands as spec

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.rabbitmq import RabbitMQBroker, topology
from dumbwaiter.brokers.types import Binding, JobFilter, Page
from dumbwaiter.errors import BrokerError
from dumbwaiter.message import EVENT, TASK, Message, uuid7
from dumbwaiter.state import State
from tests.conformance.helpers import error, eventually, fetch_all
from tests.conftest import require_service
from tests.integration.rabbitmq import server
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_state_url

CTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
HAVE_CTL = os.path.exists(CTL)


def job(queue: str = "default", **kw: object) -> Message:
    kw.setdefault("max_attempts", 4)
    return Message(id=uuid7(), kind=TASK, name="t.job", queue=queue, created_at=time.time(), **kw)  # type: ignore[arg-type]


def event(type_: str) -> Message:
    return Message(id=uuid7(), kind=EVENT, name=type_, queue="", payload={}, created_at=time.time())


@contextlib.asynccontextmanager
async def _brokers(url: str) -> AsyncIterator[Callable[[], RabbitMQBroker]]:
    """A factory of brokers on ``url``, each closed at the end."""
    made: list[Broker] = []

    def new() -> RabbitMQBroker:
        b = from_url(url)
        assert isinstance(b, RabbitMQBroker)
        made.append(b)
        return b

    try:
        yield new
    finally:
        for b in made:
            await b.close()


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Callable[[], RabbitMQBroker]]:
    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db")
    async with _brokers(url) as new:
        yield new


@pytest.fixture
async def broker(make: Callable[[], RabbitMQBroker]) -> RabbitMQBroker:
    b = make()
    await b.open()
    return b


# -- the delay cascade, as arithmetic -------------------------------------------------


def _route(units: int, target: str) -> tuple[list[int], str]:
    """Follow a delayed message through the cascade's bindings: the levels it
    rests in, and where it comes out."""
    key = topology.delay_key(units, target)
    rested = []
    for n in range(topology.LEVELS - 1, -1, -1):
        if topology.topic_matches(topology.level_pattern(n, "1"), key):
            rested.append(n)
        else:
            assert topology.topic_matches(topology.level_pattern(n, "0"), key)
    assert topology.topic_matches(topology.exit_pattern(target), key)
    return rested, target


@pytest.mark.parametrize("units", [1, 2, 3, 100, 1234567, (1 << topology.LEVELS) - 1])
def test_a_delay_rests_in_the_levels_of_its_bits(units: int) -> None:
    rested, _ = _route(units, "dw.q.some.queue:with.dots")
    assert sum(1 << n for n in rested) == units  # total time = units x UNIT
    assert not topology.topic_matches(topology.exit_pattern("dw.q.other"), "0." * 26 + "dw.q.x")


def test_delays_round_up_and_never_deliver_early() -> None:
    assert topology.delay_units(0) == 0
    assert topology.delay_units(0.001) == 1
    assert topology.delay_units(topology.UNIT) == 1
    assert topology.delay_units(topology.UNIT * 3 + 0.001) == 4
    assert topology.delay_units(10**12) == (1 << topology.LEVELS) - 1  # one pass, then again


def test_topic_patterns() -> None:
    assert topology.topic_matches("order.*", "order.created")
    assert not topology.topic_matches("order.*", "order.created.v2")
    assert topology.topic_matches("order.#", "order.created.v2")
    assert topology.topic_matches("#", "anything.at.all")
    assert not topology.topic_matches("order.created", "order.paid")


# -- against the server -------------------------------------------------------------------


async def _read_queue(name: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every message of a queue, put back afterwards (the channel closes unacked)."""
    conn = await aiormq.connect(server.amqp_base())
    try:
        ch = await conn.channel()
        out: list[tuple[bytes, dict[str, Any]]] = []
        while True:
            m = await ch.basic_get(name, no_ack=False)
            if not isinstance(m.delivery, spec.Basic.GetOk):
                return out
            out.append((m.body, dict(m.header.properties.headers or {})))
    finally:
        await conn.close()


async def test_dead_letters_keep_their_error_history_and_leave_the_dlq_on_replay(
    broker: RabbitMQBroker,
) -> None:
    m = job()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error, d.retry_at = error(message="first"), 0.0
    await broker.retry([d])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error = error(kind="myapp.PaymentDeclined", message="last", attempt=2)
    await broker.dead([d])
    [(body, headers)] = await _read_queue(broker.names.dlq("default"))
    assert [e["message"] for e in orjson.loads(body)["errors"]] == ["first", "last"]
    assert headers["x-dw-error-type"] == "myapp.PaymentDeclined"
    assert headers["x-dw-attempts"] == 2
    history = orjson.loads(str(headers["x-dw-errors"]))
    assert [(e["attempt"], e["message"]) for e in history] == [(1, "first"), (2, "last")]
    assert await broker.replay(JobFilter(state=State.DEAD)) == 1
    assert await _read_queue(broker.names.dlq("default")) == []
    [again] = await broker.fetch(["default"], 1, 30.0, 0)
    assert again.id == m.id and again.message is not None and again.message.attempt == 1


async def test_events_fan_out_by_topic_pattern(broker: RabbitMQBroker) -> None:
    await broker.declare(
        ["group:orders", "group:created"],
        [Binding("order.*", "group:orders"), Binding("order.created", "group:created")],
    )
    assert await broker.publish([event("order.created"), event("order.paid")]) == 3
    assert await broker.publish([event("invoice.sent")]) == 0
    orders = await broker.fetch(["group:orders"], 10, 30.0, 0)
    created = await broker.fetch(["group:created"], 10, 30.0, 0)
    assert sorted(d.message.name for d in orders if d.message) == ["order.created", "order.paid"]
    assert [d.message.name for d in created if d.message] == ["order.created"]
    assert {d.id for d in orders}.isdisjoint({d.id for d in created})  # a delivery each


async def test_queues_are_quorum_queues(broker: RabbitMQBroker) -> None:
    require_service("rabbitmqctl", HAVE_CTL, f"{CTL} reads the queue types")
    await broker.enqueue([job(), job(priority=3)])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.dead([d])  # the DLQ is made with the first dead letter
    vhost = server.amqp_base().rsplit("/", 1)[-1]
    cmd = [CTL, "-q", "list_queues", "-p", vhost, "name", "type"]
    done = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=60, check=True
    )
    out = done.stdout
    types = dict(line.split()[:2] for line in out.splitlines() if line.strip())
    n = broker.names
    for name in (n.lane("default"), n.lane("default", topology.HIGH), n.dlq("default")):
        assert types.get(name) == "quorum", (name, types.get(name))


async def test_a_state_store_on_redis(tmp_path: Path) -> None:
    state = redis_state_url(redis_prefix())
    b = from_url(server.url(server.new_prefix(), state))
    try:
        await b.open()
        assert b.capabilities.multi_process
        m = job()
        await b.enqueue([m])
        [d] = await b.fetch(["default"], 1, 30.0, 0)
        await b.ack([d])
        info = await b.get(m.id)
        assert info is not None and info.state is State.SUCCEEDED
        await b.kv_set({"k": b"v"})
        assert await b.kv_get(["k"]) == {"k": b"v"}
    finally:
        await b.close()


async def test_a_hung_workers_job_comes_back_and_its_late_ack_does_not_count(
    make: Callable[[], RabbitMQBroker],
) -> None:
    hung, alive = make(), make()
    await hung.open()
    await alive.open()
    m = job()
    await alive.enqueue([m])
    [stale] = await hung.fetch(["default"], 1, 0.3, 0, "w-hung")
    assert await eventually(alive.rescue, lambda n: n > 0) == 1
    [d] = await alive.fetch(["default"], 1, 30.0, 0, "w-alive")
    assert d.message is not None and d.message.attempt == 2
    await hung.ack([stale])  # wakes up late: fenced off
    info = await alive.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-alive"
    await hung.close()  # its copy goes back to the queue: stale, dropped
    assert await alive.fetch(["default"], 1, 30.0, 0.5) == []
    await alive.ack([d])
    info = await alive.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_an_ack_held_up_past_its_lease_leaves_the_next_runs_record_alone(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker acks with most of its lease to run, so it writes without
    reading the record first; the write is held up (a host cut off from the
    network: TCP keeps it until the link is back) while the lease runs out,
    the job is rescued, and another worker runs and acks it.  When the held
    write lands, the record must stay the other run's (the partitions test,
    ``tests/integration/partitions``)."""
    late, other = make(), make()
    await late.open()
    await other.open()
    m = job()
    await other.enqueue([m])
    [d] = await late.fetch(["default"], 1, 3.0, 0, "w-late")
    store = late.state
    held: list[str] = []

    def cut_off(name: str) -> None:
        write = getattr(store, name)

        async def held_up(*args: Any, **kwargs: Any) -> Any:
            if not held:
                held.append(name)
                assert await eventually(other.rescue, lambda n: n > 0, timeout=30.0) == 1
                [again] = await other.fetch(["default"], 1, 30.0, 10.0, "w-other")
                # results kept: the whole record shows whose run it is
                again.result, again.result_ttl = b'"other"', 60.0
                await other.ack([again])
            return await write(*args, **kwargs)

        monkeypatch.setattr(store, name, held_up)

    for name in ("kv_set", "kv_update"):
        cut_off(name)
    d.result, d.result_ttl = b'"late"', 60.0
    await late.ack([d])
    assert held  # the ack's write was the one held up
    info = await other.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED
    assert (info.worker, info.result) == ("w-other", b'"other"')
    assert info.message.attempt == 2


async def test_a_crashed_workers_job_waits_out_its_lease_then_runs_elsewhere(
    make: Callable[[], RabbitMQBroker],
) -> None:
    crashed, other = make(), make()
    await crashed.open()
    await other.open()
    m = job()
    await other.enqueue([m])
    [d] = await crashed.fetch(["default"], 1, 1.0, 0, "w-crashed")
    await crashed.close()  # the connection drops with the job unacked
    assert await other.fetch(["default"], 1, 30.0, 0) == []  # parked while the lease runs
    [again] = await asyncio.wait_for(other.fetch(["default"], 1, 30.0, 30.0), 20)
    assert again.id == m.id and time.time() >= d.lease_until
    assert again.message is not None and again.message.attempt == 2
    [err] = again.message.errors
    assert err.type.endswith("LeaseExpired") and err.worker == "w-crashed"


async def test_a_job_a_fetch_dead_letters_is_reported_by_the_next_rescue(
    make: Callable[[], RabbitMQBroker],
) -> None:
    """Its worker's connection died on the last attempt: the fetch that gets
    the copy back after the lease dead-letters it, and the next ``rescue()``
    of that process reports it (once), for the worker's ``on_dead``."""
    crashed, other = make(), make()
    await crashed.open()
    await other.open()
    m = job(max_attempts=1)
    await other.enqueue([m])
    await crashed.fetch(["default"], 1, 0.5, 0, "w-crashed")
    await crashed.close()  # the connection drops with the job unacked

    async def judged() -> State | None:
        assert await other.fetch(["default"], 1, 30.0, 0.5) == []
        info = await other.get(m.id)
        return None if info is None else info.state

    await eventually(judged, lambda st: st is State.DEAD, timeout=30.0)
    r = await other.rescue()
    assert r == 1 and [(d.id, d.queue, d.name) for d in r.dead] == [(m.id, "default", m.name)]
    assert r.dead[0].error.type.endswith("LeaseExpired") and r.dead[0].error.worker == "w-crashed"
    assert (await other.rescue()).dead == ()


async def test_a_job_whose_record_was_lost_still_runs(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state store lost a record (a crash of a store that does not sync
    every commit): the copy RabbitMQ confirmed waits a moment, then runs."""
    from dumbwaiter.brokers.rabbitmq import ledger as module

    monkeypatch.setattr(module, "RECORD_GRACE", 0.3)
    m = job()
    await broker.enqueue([m])
    await broker.state.kv_delete([broker.keys.job + m.id])
    assert await broker.fetch(["default"], 1, 30.0, 0) == []  # parked, waiting for it
    [d] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 20)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1
    await broker.ack([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_a_copy_that_beats_its_record_waits_in_the_worker(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer writes a job's record while RabbitMQ stores its copy: a
    consumer handed the copy before the record commits keeps it and judges it
    again a moment later (not through the delay cascade, 50 ms and more)."""
    from dumbwaiter.brokers.rabbitmq import ledger, transport
    from dumbwaiter.brokers.record import Record

    monkeypatch.setattr(ledger, "LOCAL_GRACE", 30.0)  # however slow the machine
    waiting = asyncio.Event()
    real_wait = transport._wait_for_record

    def wait(link: Any, raw: Any, now: float) -> None:
        real_wait(link, raw, now)
        waiting.set()

    monkeypatch.setattr(transport, "_wait_for_record", wait)
    parked: list[object] = []
    real_park = broker._copy_delayed_until

    def park(raw: Any, until: float) -> Any:
        parked.append(raw)
        return real_park(raw, until)

    monkeypatch.setattr(broker, "_copy_delayed_until", park)
    await broker.declare(["default"])
    m = job()
    await broker._send([broker._copy(m, 0, time.time())], True)  # the copy, no record yet
    fetch = asyncio.ensure_future(broker.fetch(["default"], 1, 30.0, 30.0))
    await asyncio.wait_for(waiting.wait(), 20)
    assert not fetch.done()
    now = time.time()
    await broker.state.kv_set(
        {
            broker.keys.job + m.id: Record(
                msg=m, state=State.READY, run_at=now, updated_at=now
            ).dump()
        }
    )
    [d] = await asyncio.wait_for(fetch, 20)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1
    assert parked == []
    await broker.ack([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_copies_go_back_to_the_buffer_when_the_state_store_fails(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch whose state-store call fails raises, and the copies it was
    judging are judged by the next fetch: they do not stay unacked, holding
    the consumer's prefetch, until the connection closes."""
    m = job()
    await broker.enqueue([m])
    real = broker.state.kv_update
    calls = 0

    async def failing_once(keys: Any, decide: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise sqlite3.OperationalError("database is locked")
        return await real(keys, decide)

    monkeypatch.setattr(broker.state, "kv_update", failing_once)
    with pytest.raises(sqlite3.OperationalError):
        await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 20)
    [d] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 20)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1
    await broker.ack([d])


async def test_purged_and_cancelled_jobs_never_run_from_their_queued_copies(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dumbwaiter.brokers.rabbitmq import ledger as module

    monkeypatch.setattr(module, "RECORD_GRACE", 0.0)
    purged, cancelled = job(), job()
    await broker.enqueue([purged, cancelled])
    assert await broker.purge(JobFilter(ids=(purged.id,))) == 1
    assert await broker.cancel([cancelled.id]) == [cancelled.id]
    assert await broker.fetch(["default"], 10, 30.0, 0) == []
    assert await broker.fetch(["default"], 10, 30.0, 0.5) == []


async def test_close_ends_the_portals_connection_before_it_returns(tmp_path: Path) -> None:
    """An App's sync calls use the portal's loop (a connection of its own),
    and ``aclose`` stops that loop right after the broker's close: so the
    close must have closed the portal's connection, and let every task
    aiormq's close starts end, before it returns.  A loop stopped on pending
    ones destroys them, and their coroutines warn when collected
    (``Channel._on_close`` was never awaited), in whatever test that is."""
    import dumbwaiter as dw

    # a state store that closes at once: nothing else gives the portal's
    # loop time to finish a close that was only scheduled
    app = dw.App(server.url(server.new_prefix(), f"memory://portal-close-{tmp_path.name}"))

    @app.task()
    def noop() -> None: ...

    from dumbwaiter.blocking import BlockingCallWarning

    with pytest.warns(BlockingCallWarning):  # sync on purpose: the portal's loop and connection
        noop.enqueue_many([() for _ in range(3)])
    assert isinstance(app.broker, RabbitMQBroker)
    [(portal_loop, link)] = app.broker._links.items()
    conn = link.conn
    assert conn is not None and not conn.is_closed
    await app.aclose()
    assert portal_loop.is_closed()
    assert cast(bool, conn.is_closed)  # mypy keeps it narrowed to False from above
    assert [t for t in asyncio.all_tasks(portal_loop) if not t.done()] == []


async def test_a_links_close_leaves_no_task_of_aiormqs_behind() -> None:
    """aiormq's ``Connection.close`` returns with follow-ups still scheduled
    (the reader's done callback closing the writer, the rejection of the
    channels' futures); the link's close waits for them, so a loop may stop
    the moment it returns."""
    from dumbwaiter.brokers.rabbitmq.link import AmqpLink

    before = asyncio.all_tasks()
    link = AmqpLink(server.amqp_base(), "dumbwaiter close-test", asyncio.get_running_loop())
    await link.ensure()
    await link.drop()
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []


def test_a_parked_copy_keeps_when_it_was_first_seen_to_the_millisecond() -> None:
    """``dw-seen`` (when a copy waiting for its record was first parked)
    survives AMQP's table encoding: a Python float header travels as a 32-bit
    float, a minute off at today's epoch, which made a copy wait up to a
    minute past ``RECORD_GRACE``, or not at all."""
    from pamqp import decode, encode

    from dumbwaiter.brokers.rabbitmq.ledger import _first_seen
    from dumbwaiter.brokers.rabbitmq.link import Raw

    b = RabbitMQBroker("amqp://guest:guest@127.0.0.1/?state=memory://seen-test")
    raw = Raw(queue="default", lane=topology.MAIN, tag=1, gen=1, redelivered=False, body=b"{}")
    before = time.time()
    _, _, _, props = b._copy_delayed_until(raw, before + 1.0)
    assert props.headers is not None
    _, headers = decode.field_table(encode.field_table(props.headers))  # as a delivery has them
    back = Raw(queue="default", lane=topology.MAIN, tag=2, gen=1, redelivered=False, body=b"{}")
    back.headers = headers
    assert before - 0.001 <= _first_seen(back, 0.0) <= time.time() + 0.001
    # parked again: the first sighting is kept
    _, _, _, props2 = b._copy_delayed_until(back, time.time() + 1.0)
    assert props2.headers is not None and props2.headers["dw-seen"] == headers["dw-seen"]


# -- admin calls racing a fetch or another admin call -----------------------------------


def _after_first_read(
    b: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Any]
) -> None:
    """Make ``b``'s next ``kv_get`` run ``meanwhile`` (another broker's call)
    after it has read and before it returns: whatever the caller writes next
    is decided on a read that ``meanwhile`` made stale."""
    real = b.state.kv_get
    done = False

    async def read_then_race(keys: Any) -> Any:
        nonlocal done
        got = await real(keys)
        if not done:
            done = True
            await meanwhile()
        return got

    monkeypatch.setattr(b.state, "kv_get", read_then_race)


async def test_a_reschedule_that_meets_a_lease_leaves_the_running_job_alone(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker leases the job between reschedule's read and its write: the
    running job's record stays (the old read-then-write made it scheduled,
    with a new version: the worker's ack was then lost and the job ran
    again), and the new copy reschedule sent waits out the live lease
    instead of running beside it once its record grace is over."""
    from dumbwaiter.brokers.rabbitmq import ledger as module

    monkeypatch.setattr(module, "RECORD_GRACE", 0.0)
    admin, worker, other = make(), make(), make()
    for b in (admin, worker, other):
        await b.open()
    m = job()
    await admin.enqueue([m])
    leased: list[Any] = []

    async def lease() -> None:
        leased.extend(await worker.fetch(["default"], 1, 30.0, 20.0, "w-1"))

    _after_first_read(admin, monkeypatch, lease)
    assert await admin.reschedule([m.id], time.time()) == []
    [d] = leased
    info = await admin.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-1"
    # its new copy comes to the consuming worker: parked behind the lease
    assert await worker.fetch(["default"], 1, 30.0, 0.5) == []
    assert await other.fetch(["default"], 1, 30.0, 0.5) == []
    await worker.ack([d])
    info = await admin.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_a_replay_that_meets_a_purge_does_not_bring_the_job_back(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another admin purges the dead job between replay's read and its
    write: the job stays purged (the old read-then-write wrote its record
    back, ready, and it ran)."""
    from dumbwaiter.brokers.rabbitmq import ledger as module

    monkeypatch.setattr(module, "RECORD_GRACE", 0.0)
    admin, other = make(), make()
    await admin.open()
    await other.open()
    m = job()
    await admin.enqueue([m])
    [d] = await other.fetch(["default"], 1, 30.0, 20.0)
    d.error = error(message="boom")
    await other.dead([d])

    async def purge() -> None:
        assert await other.purge(JobFilter(ids=(m.id,))) == 1

    _after_first_read(admin, monkeypatch, purge)
    assert await admin.replay(JobFilter(ids=(m.id,))) == 0
    assert await admin.get(m.id) is None
    assert await other.fetch(["default"], 1, 30.0, 0.5) == []


async def test_a_purge_that_meets_a_lease_leaves_the_running_job_alone(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker leases the job between purge's read and its delete: purge
    leaves it (running jobs are never purged; the old read-then-delete took
    the running job's record away, and its worker's retry wrote it back)."""
    admin, worker = make(), make()
    await admin.open()
    await worker.open()
    m = job()
    await admin.enqueue([m])
    leased: list[Any] = []

    async def lease() -> None:
        leased.extend(await worker.fetch(["default"], 1, 30.0, 20.0, "w-1"))

    _after_first_read(admin, monkeypatch, lease)
    assert await admin.purge(JobFilter(ids=(m.id,))) == 0
    [d] = leased
    info = await admin.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-1"
    await worker.ack([d])
    info = await admin.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


# -- races the state store's kv_update settles (a Redis state store) ---------------------


@pytest.fixture
async def make_on_redis() -> AsyncIterator[Callable[[], RabbitMQBroker]]:
    """Brokers sharing a namespace whose state store is Redis (the docs'
    multi-machine setup), where ``kv_update`` is optimistic: a read, then a
    compare-and-set that fails if a key read changed meanwhile."""
    url = server.url(server.new_prefix(), redis_state_url(redis_prefix()))
    async with _brokers(url) as new:
        yield new


def _when_read(
    b: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch, key: str, meanwhile: Callable[[], Any]
) -> list[bool]:
    """Make the first read of ``key`` by ``b``'s state store run ``meanwhile``
    (another broker's call) after it has read and before it returns.  The
    returned list gets True once it ran."""
    ran: list[bool] = []

    def hook(store: Any) -> None:
        real = store.kv_get

        async def read_then_race(keys: Any) -> Any:
            got = await real(keys)
            if not ran and key in keys:
                ran.append(True)
                await meanwhile()
            return got

        monkeypatch.setattr(store, "kv_get", read_then_race)

    hook(b.state)
    # a Redis store reads in its home keyspace (redis/router.py): its
    # kv_update's read is that keyspace's kv_get, not the router's
    home = getattr(b.state, "home", None)
    if home is not None:
        hook(home)
    return ran


async def test_a_cancel_that_meets_a_fetch_never_lets_both_win(
    make_on_redis: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin cancels the job between the fetch's read of its record and
    the fetch's lease write.  The cancel wins (the job had not started), so
    the fetch must not run it: its write finds the record changed, and it
    judges again (the copy is stale now).  With a read then a plain write
    both won: cancel said cancelled and the worker ran the job."""
    worker, admin = make_on_redis(), make_on_redis()
    await worker.open()
    await admin.open()
    m = job()
    await admin.enqueue([m])
    cancelled: list[str] = []

    async def cancel() -> None:
        cancelled.extend(await admin.cancel([m.id]))

    ran = _when_read(worker, monkeypatch, worker.keys.job + m.id, cancel)
    verdicts: list[Any] = []
    judged_once = asyncio.Event()
    real_update = worker.state.kv_update

    async def judged(keys: Any, decide: Any) -> Any:
        out = await real_update(keys, decide)
        verdicts.append(out)
        judged_once.set()
        return out

    monkeypatch.setattr(worker.state, "kv_update", judged)
    # the fetch waits on after dropping the copy (nothing else is queued):
    # it is watched until its admission has judged, then stopped
    fetch = asyncio.ensure_future(worker.fetch(["default"], 1, 30.0, 30.0, "w-1"))
    try:
        await asyncio.wait_for(judged_once.wait(), 20)
        assert ran and cancelled == [m.id]
        [[(verdict, _)]] = verdicts
        assert verdict == "drop"  # the copy of a cancelled job: not run
    finally:
        fetch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetch
    info = await admin.get(m.id)
    assert info is not None and info.state is State.CANCELLED


async def test_a_purge_never_frees_a_key_an_enqueue_took_over_meanwhile(
    make_on_redis: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Purging a finished job frees its unique key only while that job still
    holds it, in the same state-store update that marks the job: a job
    enqueued with the key meanwhile (a finished holder no longer blocks
    ``unique="queued"``) keeps it, so a third enqueue is its duplicate.
    With a read of the key then a delete, the purge deleted the newer job's
    hold and the third enqueue was stored beside it."""
    admin, producer = make_on_redis(), make_on_redis()
    await admin.open()
    await producer.open()
    first = job(key="report:7", headers={"unique": "queued"})
    await producer.enqueue([first])
    [d] = await admin.fetch(["default"], 1, 30.0, 20.0)
    await admin.ack([d])
    second = job(key="report:7", headers={"unique": "queued"})
    taken: list[str] = []

    async def enqueue_second() -> None:
        taken.extend(await producer.enqueue([second]))

    ran = _when_read(admin, monkeypatch, admin.keys.key + "report:7", enqueue_second)
    assert await admin.purge(JobFilter(ids=(first.id,))) == 1
    assert ran and taken == [second.id]
    third = job(key="report:7", headers={"unique": "queued"})
    assert await producer.enqueue([third]) == [second.id]
    assert await admin.get(first.id) is None


async def test_two_producers_never_both_take_a_unique_key_over(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's holder is done, and two producers enqueue with the key at
    once: the second to take it over finds the first's job holding it and
    returns that one.  With a read of the holder then a plain write, both
    took the key and both jobs were stored."""
    worker, p1, p2 = make(), make(), make()
    for b in (worker, p1, p2):
        await b.open()
    first = job(key="sync:9", headers={"unique": "queued"})
    await p1.enqueue([first])
    [d] = await worker.fetch(["default"], 1, 30.0, 20.0)
    await worker.ack([d])
    mine, theirs = (job(key="sync:9", headers={"unique": "queued"}) for _ in range(2))
    stored: list[str] = []

    async def enqueue_theirs() -> None:
        stored.extend(await p2.enqueue([theirs]))

    ran = _when_read(p1, monkeypatch, p1.keys.key + "sync:9", enqueue_theirs)
    assert await p1.enqueue([mine]) == [theirs.id]
    assert ran and stored == [theirs.id]
    assert await p1.get(mine.id) is None


# -- what the state store keeps, and for how long ---------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
async def make_short(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], RabbitMQBroker]]:
    """Brokers sharing a namespace whose finished records are kept 1 s
    (``retention=1``), on a SQLite state store (one transaction per
    ``kv_update``) and on a Redis one (a read, then a compare-and-set)."""
    state = (
        f"sqlite:///{tmp_path}/state.db"
        if request.param == "sqlite"
        else redis_state_url(redis_prefix())
    )
    url = server.url(server.new_prefix(), state, retention="1")
    async with _brokers(url) as new:
        yield new


async def test_a_cancel_never_brings_back_a_job_a_purge_deleted(
    make_short: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another admin purges the job right after cancel's state-store update:
    the job stays purged.  Cancel used to write its records a second time
    after the update (to give them their ttl), which brought the purged
    record back, cancelled, until that ttl ran out."""
    admin, other = make_short(), make_short()
    await admin.open()
    await other.open()
    m = job()
    await admin.enqueue([m])
    real = admin.state.kv_update
    purged: list[int] = []

    async def update_then_purge(keys: Any, decide: Any) -> Any:
        out = await real(keys, decide)
        if not purged:
            purged.append(await other.purge(JobFilter(ids=(m.id,))))
        return out

    monkeypatch.setattr(admin.state, "kv_update", update_then_purge)
    assert await admin.cancel([m.id]) == [m.id]
    assert purged == [1]
    assert await admin.get(m.id) is None
    assert await other.list_jobs(JobFilter()) == Page(items=[], cursor=None)


async def test_a_purge_that_dies_after_its_mark_leaves_records_that_expire(
    make_short: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge that stops between its mark (the records cancelled, the
    unique key freed) and its deletes leaves records and entries that
    expire, instead of cancelled records and empty entries kept forever."""
    b = make_short()
    await b.open()
    m = job(key="purge:1")
    await b.enqueue([m])
    real = b.state.kv_update

    async def mark_then_die(keys: Any, decide: Any) -> Any:
        await real(keys, decide)
        raise ConnectionError("the purging process died here")

    monkeypatch.setattr(b.state, "kv_update", mark_then_die)
    with pytest.raises(ConnectionError):
        await b.purge(JobFilter(ids=(m.id,)))
    monkeypatch.setattr(b.state, "kv_update", real)
    info = await b.get(m.id)
    assert info is not None and info.state is State.CANCELLED  # marked, not deleted
    entry = b.keys.key + "purge:1"
    assert await b.state.kv_get([entry]) == {entry: b""}  # freed
    await eventually(lambda: b.get(m.id), lambda i: i is None, timeout=30)
    await eventually(lambda: b.state.kv_get([entry]), lambda d: d == {}, timeout=30)


async def test_unique_keys_of_finished_cancelled_and_purged_jobs_expire(
    make_short: Callable[[], RabbitMQBroker],
) -> None:
    """The state store keeps one entry per unique key: it must not keep one
    for every key ever used.  A finished or cancelled job's entry expires
    with its record (it blocks its key as long as the record is kept), a
    purged job's freed entry expires too; a queued job's entry never
    expires, nor does the entry of a job that took over a finished job's
    key (its predecessor's expiry is not inherited)."""
    b = make_short()
    await b.open()
    live = job(key="live")
    await b.enqueue([live])  # first: its entry is the oldest
    done, handed = (
        job("other", key="done"),
        job("other", key="handed", headers={"unique": "queued"}),
    )
    cancelled, purged = job(key="cancelled"), job(key="purged")
    await b.enqueue([done, handed, cancelled, purged])
    ds = await b.fetch(["other"], 2, 30.0, 0)
    assert {d.id for d in ds} == {done.id, handed.id}
    await b.ack(ds)
    successor = job(key="handed", headers={"unique": "queued"})
    assert await b.enqueue([successor]) == [successor.id]  # a finished holder does not block
    assert await b.cancel([cancelled.id]) == [cancelled.id]
    assert await b.purge(JobFilter(ids=(purged.id,))) == 1
    gone = [b.keys.key + k for k in ("done", "cancelled", "purged")]
    await eventually(lambda: b.state.kv_get(gone), lambda d: d == {}, timeout=30)
    assert await b.get(done.id) is None  # the record went with the entry
    kept = {b.keys.key + "live": live.id.encode(), b.keys.key + "handed": successor.id.encode()}
    assert await b.state.kv_get(list(kept)) == kept
    assert await b.enqueue([job(key="live")]) == [live.id]  # still blocks
    again = job("other", key="done")
    assert await b.enqueue([again]) == [again.id]  # free again


# -- the consumers' prefetch ---------------------------------------------------------


async def _drain(broker: RabbitMQBroker, n: int, slots: int, job_time: float = 0.0) -> int:
    """Fetch and ack ``n`` jobs, ``slots`` at a time, each batch taking
    ``job_time``; the most messages RabbitMQ had handed the broker and not
    had acked back at once (neither ready in the queue nor settled)."""
    lane = broker.names.lane("default")
    conn = await aiormq.connect(server.amqp_base())
    try:
        ch = await conn.channel()
        done = pushed = 0
        while done < n:
            ds = await broker.fetch(["default"], slots, 30.0, 10.0)
            assert ds
            ok = await ch.queue_declare(lane, passive=True)
            pushed = max(pushed, n - done - int(ok.message_count or 0))
            if job_time:
                await asyncio.sleep(job_time)  # the jobs' work
            await broker.ack(ds)
            done += len(ds)
        return pushed
    finally:
        await conn.close()


async def test_a_fast_worker_is_handed_more_than_twice_its_slots(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quorum queue frees a consumer's slot only once its ack is committed:
    a worker whose jobs end fast is handed what it drains in
    ``PREFETCH_HORIZON`` beyond its slots, so it does not wait for every
    refill (here the horizon is long, so that any drain counts as fast)."""
    from dumbwaiter.brokers.rabbitmq import transport as module

    monkeypatch.setattr(module, "PREFETCH_HORIZON", 10.0, raising=False)
    monkeypatch.setattr(module, "PREFETCH_WINDOW", 0.01, raising=False)
    slots = 4
    await broker.enqueue([job() for _ in range(300)])
    assert await _drain(broker, 300, slots) > 2 * slots


async def test_a_worker_of_slow_jobs_leaves_the_rest_of_the_queue_to_others(
    broker: RabbitMQBroker,
) -> None:
    """Jobs that take a while keep the prefetch at twice the worker's slots:
    the rest of the queue stays ready for other workers."""
    slots = 4
    await broker.enqueue([job() for _ in range(40)])
    assert await _drain(broker, 40, slots, job_time=0.05) <= 2 * slots


async def test_a_fixed_prefetch_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prefetch=`` in the URL is the prefetch, however fast the worker."""
    from dumbwaiter.brokers.rabbitmq import transport as module

    monkeypatch.setattr(module, "PREFETCH_HORIZON", 10.0, raising=False)
    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db", prefetch="6")
    b = from_url(url)
    assert isinstance(b, RabbitMQBroker)
    try:
        await b.open()
        await b.enqueue([job() for _ in range(200)])
        assert await _drain(b, 200, 4) <= 6
    finally:
        await b.close()


async def test_deliveries_reach_the_buffer_without_a_task_each(broker: RabbitMQBroker) -> None:
    """aiormq runs what a consumer returns as a task; the link's consumer
    hands each delivery over inline, so a drain makes no task per message
    (~5 us each on the event loop), while every job still arrives."""
    made: list[str] = []
    loop = asyncio.get_running_loop()
    default = loop.get_task_factory()

    def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
        made.append(getattr(coro, "__qualname__", ""))
        if default is not None:
            return default(lp, coro, **kw)
        return asyncio.Task(coro, loop=lp, **kw)

    # a fixed prefetch (as ``prefetch=`` sets it): no new consumer midway;
    # the consumer starts on an empty queue (deliveries that come before
    # aiormq's wrapper of it is replaced still run as tasks, and work)
    broker.prefetch = 100
    assert await broker.fetch(["default"], 1, 30.0, 0.05) == []
    jobs = [job() for _ in range(50)]
    await broker.enqueue(jobs)
    loop.set_task_factory(factory)
    try:
        got: list[str] = []
        while len(got) < len(jobs):
            ds = await broker.fetch(["default"], 50, 30.0, 10.0)
            got += [d.id for d in ds]
            await broker.ack(ds)
    finally:
        loop.set_task_factory(default)
    assert sorted(got) == sorted(m.id for m in jobs)
    assert not [q for q in made if "on_message" in q]


async def test_a_bursts_prefetch_does_not_outlive_the_burst(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fast drain, a moment idle brings the prefetch back to twice
    the slots: slow jobs enqueued later are not all pushed to this worker."""
    from dumbwaiter.brokers.rabbitmq import transport as module

    slots = 4
    monkeypatch.setattr(module, "PREFETCH_HORIZON", 10.0)
    monkeypatch.setattr(module, "PREFETCH_WINDOW", 0.01)
    await broker.enqueue([job() for _ in range(300)])
    assert await _drain(broker, 300, slots) > 2 * slots
    monkeypatch.setattr(module, "PREFETCH_HORIZON", 0.05)
    monkeypatch.setattr(module, "PREFETCH_WINDOW", 0.1)
    # idle: the worker's fetch loop waits on an empty queue (the first rate
    # window may still hold the burst's last acks; the next one is empty)
    for _ in range(2):
        assert await broker.fetch(["default"], slots, 30.0, 0.3) == []
    await broker.enqueue([job() for _ in range(40)])
    assert await _drain(broker, 40, slots, job_time=0.05) <= 2 * slots


async def _two_batches(broker: RabbitMQBroker) -> tuple[list[Any], list[Message]]:
    """A batch leased (``first``) and more jobs waiting in the consumer's buffer."""
    broker.prefetch = 100
    assert await broker.fetch(["default"], 1, 30.0, 0.05) == []
    jobs = [job() for _ in range(6)]
    await broker.enqueue(jobs)
    first: list[Any] = []
    while len(first) < 3:
        first += await asyncio.wait_for(broker.fetch(["default"], 3 - len(first), 30.0, 10.0), 20)
    link = broker._links.current()
    assert link is not None
    while len(link.buffer) < 3:  # each delivery sets ``arrived``
        link.arrived.clear()
        await asyncio.wait_for(link.arrived.wait(), 10)
    return first, jobs


async def test_an_ack_rides_with_the_next_admission(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ack made while the worker's next fetch admits copies writes its
    records in that admission's ``kv_update``: one state-store trip for
    both, and the records are stored before the AMQP ack, as alone."""
    first, jobs = await _two_batches(broker)
    updates: list[set[str]] = []
    real = broker.state.kv_update

    async def counted(keys: Any, decide: Any) -> Any:
        updates.append(set(keys))
        return await real(keys, decide)

    monkeypatch.setattr(broker.state, "kv_update", counted)
    acked = asyncio.ensure_future(broker.ack(first))
    await asyncio.sleep(0)  # the ack waits for a ride
    second = await asyncio.wait_for(broker.fetch(["default"], 3, 30.0, 10.0), 20)
    await acked
    [admission] = updates  # the ack's records were written in it
    assert second and {broker.keys.job + d.id for d in first} <= admission
    for d in first:
        info = await broker.get(d.id)
        assert info is not None and info.state is State.SUCCEEDED
    await broker.ack(second)  # no admission comes: written alone, after a few turns
    assert updates[1:] == [{broker.keys.job + d.id for d in second}]
    left = [d.id for d in second]
    assert {m.id for m in jobs} >= set(left) | {d.id for d in first}


async def test_an_ack_whose_admission_fails_raises_and_can_be_made_again(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state store fails the admission an ack rides with: the ack raises
    (the worker keeps the outcome and makes it again), nothing was stored,
    and the next ack records it."""
    first, _ = await _two_batches(broker)
    real = broker.state.kv_update
    calls = 0

    async def failing_once(keys: Any, decide: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise sqlite3.OperationalError("database is locked")
        return await real(keys, decide)

    monkeypatch.setattr(broker.state, "kv_update", failing_once)
    acked = asyncio.ensure_future(broker.ack(first))
    await asyncio.sleep(0)
    with pytest.raises(sqlite3.OperationalError):
        await asyncio.wait_for(broker.fetch(["default"], 3, 30.0, 10.0), 20)
    with pytest.raises(BrokerError):
        await acked
    for d in first:
        info = await broker.get(d.id)
        assert info is not None and info.state is State.RUNNING
    await broker.ack(first)
    for d in first:
        info = await broker.get(d.id)
        assert info is not None and info.state is State.SUCCEEDED


# -- the enqueue's record, written while its copy is published ------------------------


async def test_an_enqueue_writes_its_record_while_its_copy_is_confirmed(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's write does not wait for the publish, nor the publish for
    the record: a record write held until the copy is confirmed does not
    hold the call up forever (written first, it would), and ``get`` after the
    call finds the job."""
    await broker.declare(["default"])
    confirmed = asyncio.Event()
    real_send, real_add = broker._send, broker.state.kv_add

    async def send(*a: Any, **kw: Any) -> None:
        await real_send(*a, **kw)
        confirmed.set()

    async def add(key: str, value: bytes, ttl: float | None = None) -> bool:
        await confirmed.wait()
        return await real_add(key, value, ttl)

    monkeypatch.setattr(broker, "_send", send)
    monkeypatch.setattr(broker.state, "kv_add", add)
    m = job()
    assert await asyncio.wait_for(broker.enqueue([m]), 20) == [m.id]
    info = await broker.get(m.id)
    assert info is not None and info.state is State.READY


async def test_a_batchs_records_are_written_while_its_copies_are_confirmed(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a batch: its records' write waits for the copies'
    confirms without holding the call up, and every job runs once."""
    await broker.declare(["default"])
    confirmed = asyncio.Event()
    real_send, real_set = broker._send, broker.state.kv_set

    async def send(*a: Any, **kw: Any) -> None:
        await real_send(*a, **kw)
        confirmed.set()

    async def kv_set(items: Any, ttl: float | None = None) -> None:
        await confirmed.wait()
        await real_set(items, ttl)

    monkeypatch.setattr(broker, "_send", send)
    monkeypatch.setattr(broker.state, "kv_set", kv_set)
    ms = [job() for _ in range(5)]
    assert await asyncio.wait_for(broker.enqueue(ms), 20) == [m.id for m in ms]
    for m in ms:
        info = await broker.get(m.id)
        assert info is not None and info.state is State.READY
    got: list[Any] = []
    while len(got) < 5:
        got += await asyncio.wait_for(broker.fetch(["default"], 10, 30.0, 10.0), 20)
    assert sorted(d.id for d in got) == sorted(m.id for m in ms)
    await broker.ack(got)
    assert await broker.fetch(["default"], 10, 30.0, 0.5) == []


async def test_a_duplicate_enqueues_copy_never_runs_with_its_own_arguments(
    broker: RabbitMQBroker,
) -> None:
    """A second enqueue of an existing id publishes its copy before it knows
    it lost the record: the copy carries its call's token, not the record's,
    and is dropped; the job runs once, with the first call's arguments."""
    m = job(payload={"n": 1})
    assert await broker.enqueue([m]) == [m.id]
    twin = Message(
        id=m.id,
        kind=TASK,
        name="t.job",
        queue="default",
        created_at=time.time(),
        payload={"n": 2},
        max_attempts=4,
    )
    assert await broker.enqueue([twin]) == [m.id]
    got = await asyncio.wait_for(broker.fetch(["default"], 10, 30.0, 1.0), 20)
    assert [d.message.payload for d in got if d.message is not None] == [{"n": 1}]
    for d in got:  # a kept result: the whole record stays, its payload shown
        d.result, d.result_ttl = b"1", 60.0
    await broker.ack(got)
    assert await broker.fetch(["default"], 10, 30.0, 0.5) == []  # the twin's copy: dropped
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED
    assert info.message.payload == {"n": 1}


async def test_a_copy_of_another_enqueue_is_dropped_even_before_the_record_runs(
    broker: RabbitMQBroker,
) -> None:
    """A copy whose token is not its record's is dropped (acked), and the
    record's own copy still runs."""
    await broker.declare(["default"])
    m = job()
    now = time.time()
    from dumbwaiter.brokers.record import Record

    rec = Record(msg=m, state=State.READY, run_at=now, updated_at=now, enq="mine")
    await broker.state.kv_set({broker.keys.job + m.id: rec.dump()})
    await broker._send([broker._copy(m, 0, now, enq="theirs")], True)
    assert await broker.fetch(["default"], 1, 30.0, 0.5) == []
    await broker._send([broker._copy(m, 0, now, enq="mine")], True)
    [d] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 10.0), 20)
    assert d.id == m.id
    await broker.ack([d])


_KILLED_PRODUCER = """
import asyncio, sys, time
from dumbwaiter.brokers import from_url
from dumbwaiter.message import TASK, Message

async def main() -> None:
    b = from_url(sys.argv[1])
    await b.open()
    await b.declare(["default"])
    real_send = b._send

    async def never(key, value, ttl=None):  # the record's write never commits
        await asyncio.Event().wait()

    async def send(*a, **kw):
        await real_send(*a, **kw)
        print("confirmed", flush=True)

    b.state.kv_add = never
    b._send = send
    m = Message(id=sys.argv[2], kind=TASK, name="t.job", queue="default",
                created_at=time.time(), max_attempts=4)
    await b.enqueue([m])

asyncio.run(main())
"""


async def test_a_producer_killed_between_the_confirm_and_the_record_leaves_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLed after RabbitMQ confirmed the copy and before the record
    committed: the copy waits for its record, then runs once, from itself
    (its record written by that admission), and no second copy runs."""
    from dumbwaiter.brokers.rabbitmq import ledger as module

    monkeypatch.setattr(module, "RECORD_GRACE", 0.5)
    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db")
    id_ = uuid7()
    script = tmp_path / "producer.py"
    script.write_text(_KILLED_PRODUCER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        url,
        id_,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"confirmed"
    proc.kill()
    await proc.wait()
    async with _brokers(url) as new:
        b = new()
        await b.open()
        assert await b.get(id_) is None  # the record never committed
        [d] = await asyncio.wait_for(b.fetch(["default"], 1, 30.0, 30.0), 20)
        assert d.id == id_ and d.message is not None and d.message.attempt == 1
        await b.ack([d])
        assert await b.fetch(["default"], 1, 30.0, 1.0) == []
        info = await b.get(id_)
        assert info is not None and info.state is State.SUCCEEDED


_KILLED_WORKER = """
import asyncio, sys
from dumbwaiter.brokers import from_url

async def main() -> None:
    b = from_url(sys.argv[1])
    await b.open()
    [d] = await b.fetch(["default"], 1, float(sys.argv[2]), 0, "w-killed")
    print("fetched", d.id, flush=True)
    await asyncio.Event().wait()  # holds it, unacked, until SIGKILLed

asyncio.run(main())
"""


async def _ready_copies(broker: RabbitMQBroker, queue: str = "default") -> int:
    """How many copies wait in ``queue``'s main lane (a passive declare)."""
    link = await broker._link()
    ok = await link.channel().queue_declare(broker.names.lane(queue), passive=True)
    return int(ok.message_count or 0)


async def _killed_holding(url: str, tmp_path: Path, lease: float) -> str:
    """A worker process that fetched the one job of ``default`` under
    ``lease``, SIGKILLed while it held it: the id it held."""
    script = tmp_path / "worker.py"
    script.write_text(_KILLED_WORKER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), url, str(lease), stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    proc.kill()
    await proc.wait()
    word, id_ = line.split()
    assert word == b"fetched"
    return id_.decode()


@pytest.mark.parametrize("parked", [False, True], ids=["given-back", "parked"])
async def test_a_rescued_copy_behind_the_stale_original_in_one_batch_still_runs(
    tmp_path: Path, parked: bool
) -> None:
    """A worker SIGKILLed holding a job: RabbitMQ gives its copy back (and a
    fetch before the lease ends parks it in the cascade until then), the
    lease runs out and the rescue sends a new copy and makes the record
    ready for it.  A fetch handed both, the original first (as a consumer's
    buffer or ``basic.get`` gives them when they come up close together),
    drops the original as stale and runs the rescued copy: a copy dropped as
    stale must not make the next copy of its job in the batch a twin (both
    were dropped, leaving a ready record that no copy serves and nothing
    rescues: the crash test's job that never finished)."""
    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db")
    async with _brokers(url) as new:
        b = new()
        await b.open()
        m = job()
        await b.enqueue([m])
        assert await _killed_holding(url, tmp_path, 3.0 if parked else 0.5) == m.id
        await eventually(lambda: _ready_copies(b), lambda n: n == 1)  # given back
        if parked:
            assert await b.fetch(["default"], 10, 30.0, 0) == []  # the lease still runs
            assert await _ready_copies(b) == 0  # in the cascade until it ends
            await eventually(lambda: _ready_copies(b), lambda n: n == 1, timeout=20)
        assert await eventually(b.rescue, lambda n: n > 0) == 1  # once the lease ran out
        info = await b.get(m.id)
        assert info is not None and info.state is State.READY
        assert await _ready_copies(b) == 2  # the original, then the rescued copy
        [d] = await b.fetch(["default"], 10, 30.0, 0)
        assert d.id == m.id and d.message is not None and d.message.attempt == 2
        [err] = d.message.errors
        assert err.type.endswith("LeaseExpired") and err.worker == "w-killed"
        await b.ack([d])
        info = await b.get(m.id)
        assert info is not None and info.state is State.SUCCEEDED
        assert await _ready_copies(b) == 0


async def test_a_losing_duplicates_copy_ahead_of_the_jobs_own_in_one_batch_leaves_it_to_run(
    broker: RabbitMQBroker,
) -> None:
    """The same rule for the enqueue token: a duplicate enqueue's copy
    (another token, dropped) just before the job's own copy in one batch
    does not make the job's own copy a twin; it runs."""
    await broker.declare(["default"])
    m = job()
    now = time.time()
    from dumbwaiter.brokers.record import Record

    rec = Record(msg=m, state=State.READY, run_at=now, updated_at=now, enq="mine")
    await broker.state.kv_set({broker.keys.job + m.id: rec.dump()})
    await broker._send(
        [broker._copy(m, 0, now, enq="theirs"), broker._copy(m, 0, now, enq="mine")], True
    )
    await eventually(lambda: _ready_copies(broker), lambda n: n == 2)
    [d] = await broker.fetch(["default"], 10, 30.0, 0)
    assert d.id == m.id
    await broker.ack([d])
    assert await _ready_copies(broker) == 0


async def test_a_record_an_older_worker_rewrote_without_the_token_still_runs_its_copy(
    make: Callable[[], RabbitMQBroker],
) -> None:
    """Rolling upgrade: a worker of a version before the enqueue tokens leased
    the job and rewrote its record without the token (``e``), then its
    connection died.  The original copy, carrying its enqueue's token
    (``dw-e``), comes back: it is judged by its version alone (a token
    mismatch needs a token on both), waits out the lease and runs."""
    crashed, other = make(), make()
    await crashed.open()
    await other.open()
    m = job()
    await other.enqueue([m])
    [d] = await crashed.fetch(["default"], 1, 0.5, 0, "w-older")
    key = crashed.keys.job + m.id
    stored = orjson.loads((await crashed.state.kv_get([key]))[key])
    assert stored.pop("e") is not None  # the new version's lease kept it...
    await crashed.state.kv_set({key: orjson.dumps(stored)})  # ...the older one's did not
    await crashed.close()  # the connection drops with the job unacked
    [again] = await asyncio.wait_for(other.fetch(["default"], 1, 30.0, 15.0), 20)
    assert again.id == m.id and time.time() >= d.lease_until
    assert again.message is not None and again.message.attempt == 2
    [err] = again.message.errors
    assert err.type.endswith("LeaseExpired") and err.worker == "w-older"
    await other.ack([again])
    info = await other.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_a_copy_without_a_token_or_under_a_record_without_one_is_judged_by_version(
    broker: RabbitMQBroker,
) -> None:
    """The token drops a copy only against a record that has another one:
    a tokenless record runs a tokened copy, a tokened record a tokenless copy
    (a rescue's, a retry's), and two tokens that differ drop the copy."""
    await broker.declare(["default"])
    from dumbwaiter.brokers.record import Record

    for record_enq, copy_enq, runs in [
        (None, "mine", True),
        ("mine", None, True),
        ("mine", "theirs", False),
        ("mine", "mine", True),
    ]:
        m = job()
        now = time.time()
        rec = Record(msg=m, state=State.READY, run_at=now, updated_at=now, enq=record_enq)
        await broker.state.kv_set({broker.keys.job + m.id: rec.dump()})
        await broker._send([broker._copy(m, 0, now, enq=copy_enq)], True)
        got = await broker.fetch(["default"], 1, 30.0, 5.0 if runs else 0.5)
        assert [d.id for d in got] == ([m.id] if runs else []), (record_enq, copy_enq)
        await broker.ack(got)


# -- a worker's outcome racing a rescue ----------------------------------------


async def _leased_briefly(
    make: Callable[[], RabbitMQBroker], lease: float = 1.5, worker: str = "w-slow"
) -> tuple[RabbitMQBroker, RabbitMQBroker, RabbitMQBroker, Message, Any]:
    """Three open brokers (``slow``, ``rescuer``, ``other``) and a job that
    ``slow`` (as ``worker``) holds on a lease of ``lease`` s, with its delivery."""
    slow, rescuer, other = make(), make(), make()
    for b in (slow, rescuer, other):
        await b.open()
    m = job()
    await rescuer.enqueue([m])
    [d] = await slow.fetch(["default"], 1, lease, 0, worker)
    return slow, rescuer, other, m, d


async def _the_holder_finishes(
    holder: RabbitMQBroker, t: Any, m: Message, worker: str = "w-other"
) -> None:
    """The job runs under ``worker`` (``holder``'s lease) and its ack counts."""
    info = await holder.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == worker
    await holder.ack([t])
    info = await holder.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


@pytest.mark.parametrize("outcome", ["retry", "dead"])
async def test_an_outcome_that_meets_a_rescue_leaves_the_new_holders_job_alone(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """A worker's retry (or dead letter) trusts its own lease (more than
    ``SURE`` left) and publishes its copy; the publish is slow, the lease
    runs out meanwhile, the job is rescued and another worker takes it.  The
    outcome's record write must then leave that worker's lease alone: a
    blind write set the record ``retrying``/``dead`` under the running job,
    whose ack was then fenced off (the job ran on with no record of it, and
    a retry's copy, of the rescue's version, was dropped as sent twice)."""
    slow, rescuer, other, m, d = await _leased_briefly(make)
    taken: list[Any] = []
    real_send = slow._send

    async def send_after_a_takeover(copies: Any, confirm: bool) -> Any:
        if not taken:
            assert await eventually(rescuer.rescue, lambda n: n > 0) == 1
            taken.extend(await other.fetch(["default"], 1, 30.0, 10.0, "w-other"))
        return await real_send(copies, confirm)

    monkeypatch.setattr(slow, "_send", send_after_a_takeover)
    d.error = error()
    d.retry_at = time.time()
    await (slow.retry([d]) if outcome == "retry" else slow.dead([d]))
    [t] = taken
    await _the_holder_finishes(other, t, m)


# -- a heartbeat racing a rescue -------------------------------------------------


async def test_a_heartbeat_that_meets_a_takeover_reports_the_lease_lost(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat looked at its lease (still its own), then the lease ran
    out, was rescued and another worker took the job before the heartbeat
    wrote.  The heartbeat must leave that worker's record alone and report
    the lease lost: a blind write set the record back to the first worker,
    and the new holder's ack was fenced off (the job ran, its record never
    said so)."""
    slow, rescuer, other, m, d = await _leased_briefly(make)
    taken: list[Any] = []
    real_owned = slow._still_leased

    async def owned_then_a_takeover(ds: Any) -> Any:
        out = await real_owned(ds)
        if not taken:
            assert await eventually(rescuer.rescue, lambda n: n > 0) == 1
            taken.extend(await other.fetch(["default"], 1, 30.0, 10.0, "w-other"))
        return out

    monkeypatch.setattr(slow, "_still_leased", owned_then_a_takeover)
    lost = await slow.extend([d], 30.0)
    [t] = taken
    assert [x.id for x in lost] == [m.id]
    await _the_holder_finishes(other, t, m)


async def test_a_rescue_that_meets_a_heartbeat_leaves_the_lease_to_its_worker(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rescuer read an expired lease; before it wrote, the worker's
    heartbeat renewed it.  The rescue must lose (the worker is alive and
    holds the job): it compared version, token and state only, so it set
    the job ready under its running worker, whose ack was then fenced off
    while the rescue's copy ran the job a second time."""
    worker, rescuer, other, m, d = await _leased_briefly(make, lease=1.0, worker="w-late")
    beats: list[list[Any]] = []
    real_send = rescuer._send

    async def a_heartbeat_before_the_write(copies: Any, confirm: bool) -> Any:
        if copies and not beats:
            beats.append(await worker.extend([d], 60.0))
        return await real_send(copies, confirm)

    monkeypatch.setattr(rescuer, "_send", a_heartbeat_before_the_write)
    # the lease runs out unseen by its worker; the rescue that finds it
    # first (then the heartbeat comes) must take nothing
    got = await eventually(rescuer.rescue, lambda r: bool(beats))
    assert beats == [[]]  # the heartbeat kept the lease
    assert got == 0
    assert await other.fetch(["default"], 1, 30.0, 1.0, "w-other") == []
    await _the_holder_finishes(worker, d, m, "w-late")


async def test_a_rescue_whose_publish_failed_is_tried_again_at_once(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rescue claims each expired lease before it publishes its copy.  When
    the publish fails (RabbitMQ went away), the claims must go with it: left
    in place, they kept every later rescue, in any process, off those jobs
    for the claim's hour."""
    worker, rescuer, later = make(), make(), make()
    for b in (worker, rescuer, later):
        await b.open()
    m = job()
    await rescuer.enqueue([m])
    await worker.fetch(["default"], 1, 1.0, 0, "w-dead")
    real_send = rescuer._send

    async def unreachable(copies: Any, confirm: bool) -> Any:
        if copies:
            raise BrokerError("rabbitmq publish: connection refused")
        return await real_send(copies, confirm)

    monkeypatch.setattr(rescuer, "_send", unreachable)

    async def rescue_until_it_fails() -> bool:
        try:
            await rescuer.rescue()
        except BrokerError:
            return True
        return False

    assert await eventually(rescue_until_it_fails, bool)
    assert await later.rescue() == 1
    [d] = await later.fetch(["default"], 1, 30.0, 10.0, "w-next")
    assert d.id == m.id and d.message is not None and d.message.attempt == 2


# -- replay: copies first, records next ------------------------------------------------------


async def _dead_jobs(b: RabbitMQBroker, n: int) -> list[str]:
    """``n`` jobs of ``default``, each dead after its one attempt."""
    ms = [job(max_attempts=1) for _ in range(n)]
    await b.enqueue(ms)
    ds = await fetch_all(b)
    for d in ds:
        d.error = error(message="boom")
    await b.dead(ds)
    assert sorted(d.id for d in ds) == sorted(m.id for m in ms)
    return [m.id for m in ms]


async def test_a_replays_copy_that_beats_its_record_waits_for_it(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replay`` confirms the new copies, then rewrites the records: a
    worker handed a copy in between finds its record still dead.  The copy
    is newer than that record, so it waits for it (it was dropped as a
    finished job's, and the replayed record stayed ready with no copy, for
    ever)."""
    admin, worker = make(), make()
    await admin.open()
    await worker.open()
    ids = await _dead_jobs(admin, 3)
    real_swap = admin._write_if_unchanged

    async def swap_after_the_worker_looked(planned: Any) -> Any:
        # every copy is in the lane: the worker judges each against a dead record
        assert await worker.fetch(["default"], 10, 30.0, 0) == []
        return await real_swap(planned)

    monkeypatch.setattr(admin, "_write_if_unchanged", swap_after_the_worker_looked)
    assert await admin.replay(JobFilter(state=State.DEAD)) == 3
    got: list[str] = []
    while len(got) < 3:
        ds = await asyncio.wait_for(worker.fetch(["default"], 10, 30.0, 10.0), 20)
        assert ds, f"the replayed jobs never came back: {sorted(set(ids) - set(got))}"
        got += [d.id for d in ds]
        await worker.ack(ds)
    assert sorted(got) == sorted(ids)


async def test_every_replayed_job_runs_while_a_worker_drains_the_queue(
    make: Callable[[], RabbitMQBroker],
) -> None:
    """The issue's run: 50 dead jobs replayed while a worker consumes the
    queue.  Every one of them must run (34 and 40 of 50 did: the rest were
    dropped as dead before replay's record write and stayed ready with no
    copy)."""
    admin, worker = make(), make()
    await admin.open()
    await worker.open()
    ids = await _dead_jobs(admin, 50)
    ran: set[str] = set()

    async def drain() -> None:
        while True:
            ds = await worker.fetch(["default"], 10, 30.0, 1.0)
            ran.update(d.id for d in ds)
            await worker.ack(ds)

    assert await worker.fetch(["default"], 10, 30.0, 0.05) == []  # its consumer is on the lane
    draining = asyncio.ensure_future(drain())
    try:
        assert await admin.replay(JobFilter(state=State.DEAD)) == 50

        async def succeeded() -> int:
            infos = [await admin.get(i) for i in ids]
            return sum(1 for info in infos if info is not None and info.state is State.SUCCEEDED)

        await eventually(succeeded, lambda n: n == 50, timeout=30.0)
    finally:
        draining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await draining
    assert ran == set(ids)


# -- messages that are not envelopes -------------------------------------------------------

#: what another AMQP client may put on a job queue: bytes, text, JSON that is
#: not an envelope (one with a message id), and bytes that are not UTF-8
_NOT_ENVELOPES = [
    (b"\x00\x01garbage\x02", None),
    (b"hello, not json", None),
    (b'{"order": 17, "note": "an envelope has an id, a kind, a name"}', "their-own-id"),
    (b"\xff\xfe\xfd not utf-8", None),
]


async def _publish_raw(queue: str, bodies: list[tuple[bytes, str | None]]) -> None:
    """Put ``bodies`` straight on a lane, as another AMQP client would."""
    conn = await aiormq.connect(server.amqp_base())
    try:
        ch = await conn.channel()
        for body, message_id in bodies:
            await ch.basic_publish(
                body,
                exchange="",
                routing_key=queue,
                properties=spec.Basic.Properties(delivery_mode=2, message_id=message_id),
            )
    finally:
        await conn.close()


def _cli(url: str, *args: str) -> Any:
    """``dumbwaiter ARGS --url URL --json`` in-process: its decoded output."""
    from click.testing import CliRunner

    from dumbwaiter.cli import main

    result = CliRunner().invoke(main, [*args, "--json", "--url", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


async def test_a_message_that_is_not_an_envelope_is_a_dead_job_users_can_see(
    tmp_path: Path,
) -> None:
    """Raw messages put on the queue by another client: the worker
    dead-letters each (it did, into the DLQ only: ``dlq ls`` showed 0,
    ``stats`` nothing, ``dlq show`` "no such job").  Now each is a dead job
    of the state store: listed, counted, shown with its body as it came,
    put back as it came by a replay (and dead again, under the same id), and
    purged (out of the DLQ too)."""
    import dumbwaiter as dw

    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db")
    app = dw.App(url)
    admin = app.broker
    assert isinstance(admin, RabbitMQBroker)
    await admin.open()
    await admin.declare(["default"])
    await _publish_raw(admin.names.lane("default"), _NOT_ENVELOPES)

    async def dead() -> list[Any]:
        return (await admin.list_jobs(JobFilter(state=State.DEAD))).items

    async def work_until(done: Callable[[list[Any]], bool]) -> list[Any]:
        worker = dw.Worker(app, queues=("default",), concurrency=2, fetch_wait=0.2)
        run = asyncio.ensure_future(worker.run())
        try:
            return await eventually(dead, done, timeout=30)
        finally:
            worker.stop()
            await run

    try:
        infos = await work_until(lambda items: len(items) == len(_NOT_ENVELOPES))
        bodies = {body for body, _ in _NOT_ENVELOPES}
        assert {i.raw for i in infos} == bodies
        for info in infos:
            assert info.message.queue == "default" and info.message.id != "their-own-id"
            assert info.message.errors[-1].type.endswith("MessageDecodeError")
            got = await admin.get(info.message.id)
            assert got is not None and got.state is State.DEAD and got.raw == info.raw
        [row] = [s for s in await admin.stats() if s.queue == "default"]
        assert (row.dead, row.ready, row.running) == (len(bodies), 0, 0)
        dlq = await _read_queue(admin.names.dlq("default"))
        assert sorted(body for body, _ in dlq) == sorted(bodies)

        # what the user ran: the same answers through the CLI
        listed = await asyncio.to_thread(_cli, url, "dlq", "ls")
        assert {i["id"] for i in listed["items"]} == {i.message.id for i in infos}
        [utf8] = [i for i in infos if i.raw == b"hello, not json"]
        shown = await asyncio.to_thread(_cli, url, "dlq", "show", utf8.message.id)
        assert shown["raw"] == "hello, not json" and shown["state"] == "dead"
        stats = await asyncio.to_thread(_cli, url, "stats")
        [stat] = [s for s in stats["queues"] if s["queue"] == "default"]
        assert stat["dead"] == len(bodies)

        # a replay puts the body back as it came; it is dead again, same job
        assert await admin.replay(JobFilter(ids=(utf8.message.id,))) == 1
        again = await work_until(
            lambda items: any(i.message.id == utf8.message.id and i.replays == 1 for i in items)
        )
        [back] = [i for i in again if i.message.id == utf8.message.id]
        assert back.raw == b"hello, not json" and len(back.message.errors) == 2
        assert len(again) == len(bodies)

        assert await admin.purge(JobFilter(state=State.DEAD)) == len(bodies)
        assert await dead() == []
        [row] = [s for s in await admin.stats() if s.queue == "default"]
        assert row.dead == 0
        assert await _read_queue(admin.names.dlq("default")) == []
    finally:
        await app.aclose()


# -- records without a copy ----------------------------------------------------------------

_PRODUCER_IN_AN_OUTAGE = """
import asyncio, sys, time
from dumbwaiter.brokers import from_url
from dumbwaiter.message import TASK, Message

async def main() -> None:
    b = from_url(sys.argv[1])
    await b.open()
    await b.declare(["default"])

    async def unreachable(*a, **kw):  # RabbitMQ is down: the publish keeps trying
        await asyncio.Event().wait()

    b._send = unreachable
    ms = [Message(id=i, kind=TASK, name="t.job", queue="default", created_at=time.time(),
                  max_attempts=4) for i in sys.argv[2:]]
    enqueue = asyncio.ensure_future(b.enqueue(ms))  # the records are written meanwhile
    keys = [b.keys.job + m.id for m in ms]
    while len(await b.state.kv_get(keys)) < len(keys):
        assert not enqueue.done()
        await asyncio.sleep(0.01)
    print("written", flush=True)
    await enqueue

asyncio.run(main())
"""


async def test_a_producer_killed_in_an_outage_leaves_records_that_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLed while its publish kept trying (RabbitMQ unreachable), after
    the records were written: ready records with no copy, listed for ever
    with a growing lag.  A worker's rescue sends their copies again once they
    have waited past the producer's retry window, and each job runs, once."""
    import dumbwaiter as dw
    from dumbwaiter.brokers.rabbitmq import outcomes as module

    monkeypatch.setattr(module, "RECONCILE_EVERY", 0.2)
    monkeypatch.setattr(module, "STRANDED_AFTER", 0.5)
    url = server.url(server.new_prefix(), f"sqlite:///{tmp_path}/state.db", reconnect="0.5")
    ids = [uuid7(), uuid7()]
    script = tmp_path / "producer.py"
    script.write_text(_PRODUCER_IN_AN_OUTAGE)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), url, *ids, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    proc.kill()
    await proc.wait()
    assert line.strip() == b"written"

    app = dw.App(url)
    ran: list[str] = []

    @app.task(name="t.job")
    def work(ctx: dw.Context) -> None:
        ran.append(ctx.job_id)

    admin = app.broker
    assert isinstance(admin, RabbitMQBroker)
    try:
        await admin.open()
        for i in ids:
            info = await admin.get(i)
            assert info is not None and info.state is State.READY
        assert await _ready_copies(admin) == 0  # no copy: nothing would ever run them
        worker = dw.Worker(app, queues=("default",), concurrency=2, fetch_wait=0.2)
        run = asyncio.ensure_future(worker.run())
        try:

            async def states() -> list[State | None]:
                infos = [await admin.get(i) for i in ids]
                return [None if info is None else info.state for info in infos]

            await eventually(states, lambda st: st == [State.SUCCEEDED] * 2, timeout=30)
        finally:
            worker.stop()
            await run
        assert sorted(ran) == sorted(ids)  # each once
        assert await _ready_copies(admin) == 0
    finally:
        await app.aclose()


async def test_a_job_sent_again_while_its_first_copy_was_held_still_runs_once(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconcile cannot tell a lost copy from one held unacked by a
    consumer (the lane is empty either way): it sends the job's copy again.
    The two are copies of one version, and the job runs once: the first
    copy, given back after the job finished, is dropped."""
    from dumbwaiter.brokers.rabbitmq import outcomes as module

    monkeypatch.setattr(module, "STRANDED_AFTER", 0.0)
    broker.reconnect = 0.0
    m = job()
    await broker.enqueue([m])
    holder = await aiormq.connect(server.amqp_base())
    try:
        ch = await holder.channel()
        held = await ch.basic_get(broker.names.lane("default"), no_ack=False)
        assert isinstance(held.delivery, spec.Basic.GetOk)  # unacked, on another connection
        assert await broker.rescue() == 0  # no lease ran out; the reconcile sends the copy
        assert await _ready_copies(broker) == 1
        [d] = await broker.fetch(["default"], 10, 30.0, 0)
        assert d.id == m.id and d.message is not None and d.message.attempt == 1
        await broker.ack([d])
    finally:
        await holder.close()  # the first copy goes back to the lane
    await eventually(lambda: _ready_copies(broker), lambda n: n == 1)
    assert await broker.fetch(["default"], 10, 30.0, 0) == []  # judged: a finished job's
    assert await _ready_copies(broker) == 0
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and info.message.attempt == 1


async def test_a_reconcile_leaves_a_lane_that_holds_messages_alone(
    broker: RabbitMQBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting jobs in a lane with messages may have their copies in it (a
    backlog): none is sent again, which would put it behind the backlog and
    grow the queue with every period."""
    from dumbwaiter.brokers.rabbitmq import outcomes as module

    monkeypatch.setattr(module, "STRANDED_AFTER", 0.0)
    broker.reconnect = 0.0
    await broker.enqueue([job() for _ in range(3)])
    assert await broker.rescue() == 0
    assert await _ready_copies(broker) == 3


async def test_a_job_leased_while_a_heartbeat_writes_still_comes_back_from_a_hung_worker(
    make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat writes the worker's whole lease map, made from a copy taken
    before its write went out. A fetch that leased a job meanwhile was left
    out of the map the heartbeat wrote; had the worker then hung (its
    connection alive, so RabbitMQ redelivers nothing), no rescuer would ever
    see that job's lease run out, and it waited for the process to die."""
    worker, rescuer, other = make(), make(), make()
    for b in (worker, rescuer, other):
        await b.open()
    first, second = job(), job()
    await rescuer.enqueue([first])
    [held] = await worker.fetch(["default"], 1, 30.0, 0, "w-hangs")
    await rescuer.enqueue([second])
    leased: list[Any] = []
    real_update = worker.state.kv_update

    async def a_fetch_while_the_heartbeat_writes(keys: Any, decide: Any) -> Any:
        if not leased:
            # the heartbeat's write is about to go out: a fetch comes first
            leased.append(None)
            leased[:] = await worker.fetch(["default"], 1, 0.5, 0, "w-hangs")
        return await real_update(keys, decide)

    monkeypatch.setattr(worker.state, "kv_update", a_fetch_while_the_heartbeat_writes)
    assert await worker.extend([held], 30.0) == []
    [d] = leased
    assert d.id == second.id
    # the worker hangs from here on: the rescuer must find the short lease
    assert await eventually(rescuer.rescue, lambda r: r > 0) == 1
    [again] = await other.fetch(["default"], 1, 30.0, 10.0, "w-other")
    assert again.id == second.id and again.message is not None
    assert again.message.attempt == 2
    await other.ack([again])
    await worker.ack([held])
    info = await rescuer.get(first.id)
    assert info is not None and info.state is State.SUCCEEDED


async def _both_jobs(worker: RabbitMQBroker) -> list[Any]:
    """The two jobs a test enqueued, fetched by ``worker`` (opened here)."""
    await worker.open()
    got: list[Any] = []
    while len(got) < 2:
        more = await worker.fetch(["default"], 10, 30.0, 10.0, "w")
        assert more, f"only {len(got)} of 2 jobs came"
        got += more
    return got


async def test_a_confirm_lost_on_the_usual_enqueue_sends_again_and_the_job_runs_once(
    broker: RabbitMQBroker, make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual enqueue (a lane this connection published to) puts its copy
    on the wire, then waits for the confirm; the connection fails before the
    confirm comes, though RabbitMQ took the copy. The call sends the copy
    again and returns the id: two copies of one enqueue, and the job still
    runs once, with its own arguments."""
    first = job()
    await broker.enqueue([first])  # the lane is now one this connection published to
    link = broker._links.get()
    real_confirm = link.confirm_one
    lost: list[Any] = []

    async def confirmed_then_lost(started: Any) -> None:
        await real_confirm(started)  # the copy is in the queue for sure
        if not lost:
            lost.append(started)
            raise ConnectionError("connection lost before the confirm")

    monkeypatch.setattr(link, "confirm_one", confirmed_then_lost)
    m = job(args=[7])
    assert await broker.enqueue([m]) == [m.id]
    assert lost, "the enqueue did not take the usual path"
    worker = make()
    got = await _both_jobs(worker)
    assert sorted(d.id for d in got) == sorted([first.id, m.id])
    [d] = [d for d in got if d.id == m.id]
    assert d.message is not None and d.message.args == [7]
    await worker.ack(got)
    # the second copy of ``m`` is stale: nothing more runs
    assert await worker.fetch(["default"], 10, 30.0, 1.0, "w") == []
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and info.message.attempt == 1


async def test_a_usual_enqueue_whose_start_fails_is_sent_the_other_way(
    broker: RabbitMQBroker, make: Callable[[], RabbitMQBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual enqueue's first step fails before anything went out (the
    connection broke): the call sends the copy through the general path and
    returns the id, and the job runs once."""
    await broker.enqueue([job()])
    link = broker._links.get()
    failed: list[Any] = []

    async def broken(item: Any) -> Any:
        failed.append(item)
        raise ConnectionError("the socket broke")

    monkeypatch.setattr(link, "start_one", broken)
    m = job(args=[8])
    assert await broker.enqueue([m]) == [m.id]
    assert failed, "the enqueue did not take the usual path"
    worker = make()
    got = await _both_jobs(worker)
    [d] = [d for d in got if d.id == m.id]
    assert d.message is not None and d.message.args == [8]
    await worker.ack(got)
    assert await worker.fetch(["default"], 10, 30.0, 1.0, "w") == []
