"""An enqueue writes its record and sends its copy at once (``jobs.enqueue``).

So a worker may read a new job's copy before its record.  What a user relies
on, each case against tansu and a Redis state store:

* a copy read before its record waits for it, and the job runs once;
* a copy whose record never comes (the record's write failed: the call
  raised) is dropped after the grace, never run;
* a record whose copy could not be sent is forgotten (the call raised), and
  if even that fails, the reconcile gives it a copy: never a job stranded;
* a record written so late that a worker may have dropped the copy meanwhile
  gets its copy again before the call returns: a job whose enqueue returned
  is never lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from aiokafka.errors import KafkaError

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.brokers.kafka.jobs import CHUNK
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually
from tests.integration.kafka.server import new_prefix, url
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_url

Decide = Callable[[dict[str, bytes]], tuple[Mapping[str, Any], Any]]


def _url(**options: str) -> str:
    return url(new_prefix(), redis_url(redis_prefix()), session_timeout="2", **options)


async def _pair(**options: str) -> tuple[KafkaBroker, KafkaBroker]:
    """A producer and a worker of one app, both admitted, the worker in
    its consumer group (a fetch that does not wait)."""
    u = _url(**options)
    producer, worker = from_url(u), from_url(u)
    assert isinstance(producer, KafkaBroker) and isinstance(worker, KafkaBroker)
    await producer.open()
    await producer.declare(["default"])
    assert await worker.fetch(["default"], 1, 30.0, 0) == []
    return producer, worker


def _met_without_record(
    monkeypatch: pytest.MonkeyPatch, worker: KafkaBroker, ids: set[str]
) -> asyncio.Event:
    """An event set when the worker judges a copy of one of ``ids`` and
    reads no record for it."""
    met = asyncio.Event()
    real, real_known = worker.state.kv_update, worker.state.kv_update_known
    keys = {worker.names.job + i for i in ids}

    def spied(wanted: list[str], decide: Decide) -> Decide:
        def seen(got: dict[str, bytes]) -> tuple[Mapping[str, Any], Any]:
            if any(k in keys and k not in got for k in wanted):
                met.set()
            return decide(got)

        return seen

    async def spy(wanted: list[str], decide: Decide) -> Any:
        return await real(wanted, spied(wanted, decide))

    # a judge of first copies decides on what they say first (``belief.py``),
    # then on what it reads when that was wrong
    async def spy_known(wanted: list[str], decide: Decide, known: Any) -> Any:
        return await real_known(wanted, spied(wanted, decide), known)

    monkeypatch.setattr(worker.state, "kv_update", spy)
    monkeypatch.setattr(worker.state, "kv_update_known", spy_known)
    return met


def _hold_records(
    monkeypatch: pytest.MonkeyPatch, producer: KafkaBroker, until: asyncio.Event
) -> None:
    """The producer's record writes wait for ``until`` (its copies do not)."""
    add, known = producer.state.kv_add, producer.state.kv_update_known

    async def held_add(key: str, value: bytes, ttl: float | None = None) -> bool:
        if key.startswith(producer.names.job):
            await until.wait()
        return await add(key, value, ttl)

    async def held_update(keys: list[str], decide: Decide, believed: Any) -> Any:
        if any(k.startswith(producer.names.job) for k in keys):
            await until.wait()
        return await known(keys, decide, believed)

    monkeypatch.setattr(producer.state, "kv_add", held_add)
    monkeypatch.setattr(producer.state, "kv_update_known", held_update)


def _fail_records(monkeypatch: pytest.MonkeyPatch, producer: KafkaBroker) -> None:
    """The producer's record writes fail (the state store went away)."""

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise dw.BrokerUnavailable("the state store is down")

    for name in ("kv_add", "kv_update", "kv_update_known"):
        monkeypatch.setattr(producer.state, name, down)


async def _judged(b: KafkaBroker) -> int:
    """Copies of the queue judged and done with (taken or dropped): the sum
    of its partitions' committed offsets (their low-water marks)."""
    return sum(p.committed for p in await b.partition_lag() if p.queue == "default")


async def _run_all(worker: KafkaBroker, ids: set[str]) -> list[str]:
    """Fetch and ack until every job of ``ids`` ran; what ran, in order."""
    ran: list[str] = []
    while not ids <= set(ran):
        got = await worker.fetch(["default"], 50, 30.0, 10.0)
        assert got, f"jobs never came: {sorted(ids - set(ran))}"
        ran += [d.id for d in got]
        await worker.ack(got)
    return ran


@pytest.mark.parametrize("n", [1, 20], ids=["one", "bulk"])
async def test_a_copy_read_before_its_record_waits_for_it_and_runs_once(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    producer, worker = await _pair()
    try:
        ms = [msg() for _ in range(n)]
        ids = {m.id for m in ms}
        met = _met_without_record(monkeypatch, worker, ids)
        _hold_records(monkeypatch, producer, met)
        enqueued = asyncio.ensure_future(producer.enqueue(ms))
        ran = await _run_all(worker, ids)  # the records are written once it met a copy
        assert met.is_set()
        assert await enqueued == [m.id for m in ms]
        assert sorted(ran) == sorted(ids)  # each once
        assert await worker.fetch(["default"], 50, 30.0, 1.0) == []
        await eventually(lambda: _judged(worker), lambda judged: judged == n)
    finally:
        await worker.close()
        await producer.close()


@pytest.mark.parametrize("n", [1, 20], ids=["one", "bulk"])
async def test_a_copy_whose_record_failed_is_dropped_after_the_grace_and_never_runs(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    producer, worker = await _pair()
    try:
        ms = [msg() for _ in range(n)]
        met = _met_without_record(monkeypatch, worker, {m.id for m in ms})
        _fail_records(monkeypatch, producer)
        with pytest.raises(dw.BrokerUnavailable, match="state store is down"):
            await producer.enqueue(ms)  # the copies were sent meanwhile
        # within the grace the copies wait, judged but not done with: the
        # committed offsets stay behind them
        assert await worker.fetch(["default"], 50, 30.0, 3.0) == []
        assert met.is_set()
        assert await _judged(worker) == 0
        worker.record_grace = 0.0  # the grace is over: each is dropped, none runs
        assert await worker.fetch(["default"], 50, 30.0, 1.0) == []
        await eventually(lambda: _judged(worker), lambda judged: judged == n)
        assert [await worker.get(m.id) for m in ms] == [None] * n
    finally:
        await worker.close()
        await producer.close()


async def _send_fails(items: Any) -> list[asyncio.Future[object]]:
    """The copies are handed over and the cluster refuses them."""
    refused: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    refused.set_exception(KafkaError("the cluster refused the copies"))
    return [refused]


@pytest.mark.parametrize("n", [1, 20], ids=["one", "bulk"])
async def test_a_record_whose_copy_failed_is_forgotten(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    producer, worker = await _pair()
    try:
        ms = [msg() for _ in range(n)]
        monkeypatch.setattr(producer, "_hand_over", _send_fails)
        with pytest.raises(dw.BrokerError, match="refused the copies"):
            await producer.enqueue(ms)  # the records were written meanwhile
        assert [await worker.get(m.id) for m in ms] == [None] * n
        assert await worker.fetch(["default"], 50, 30.0, 1.0) == []
    finally:
        await worker.close()
        await producer.close()


async def test_a_record_whose_copy_failed_and_could_not_be_forgotten_gets_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cleanup failed too: the record stays (the caller was told the
    enqueue failed, as after any timeout whose outcome is unknown), and the
    reconcile (``stranded=``) gives it a copy rather than leave it stranded."""
    producer, worker = await _pair(stranded="1")
    try:
        m = msg()
        monkeypatch.setattr(producer, "_hand_over", _send_fails)

        async def cannot(keys: Any) -> int:
            raise dw.BrokerUnavailable("the state store is down")

        monkeypatch.setattr(producer.state, "kv_delete", cannot)
        with pytest.raises(dw.BrokerError, match="refused the copies"):
            await producer.enqueue([m])
        info = await worker.get(m.id)
        assert info is not None and info.state is State.READY

        async def runs() -> list[str]:
            await worker.rescue()  # the reconcile runs with it
            got = await worker.fetch(["default"], 10, 30.0, 0.5)
            await worker.ack(got)
            return [d.id for d in got]

        assert await eventually(runs, lambda ran: ran == [m.id], timeout=30)
        assert await worker.fetch(["default"], 10, 30.0, 1.0) == []
    finally:
        await worker.close()
        await producer.close()


async def test_a_record_written_after_a_worker_dropped_its_copy_gets_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, worker = await _pair()
    producer.record_grace = worker.record_grace = 0.5
    try:
        m = msg()
        dropped = asyncio.Event()
        _hold_records(monkeypatch, producer, dropped)
        enqueued = asyncio.ensure_future(producer.enqueue([m]))
        # the copy is read, waits out the grace without its record, is dropped
        assert await worker.fetch(["default"], 10, 30.0, 2.0) == []
        await eventually(lambda: _judged(worker), lambda judged: judged == 1)
        dropped.set()  # then the record is written, late
        assert await enqueued == [m.id]
        assert await _run_all(worker, {m.id}) == [m.id]  # from the copy sent again
        assert await worker.fetch(["default"], 10, 30.0, 1.0) == []
        await eventually(lambda: _judged(worker), lambda judged: judged == 2)
    finally:
        await worker.close()
        await producer.close()


async def test_a_second_enqueue_of_an_id_runs_the_first_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A duplicate id's copy is sent with its (losing) record write: it is
    judged by the first enqueue's record, so the job runs once, with the
    first enqueue's arguments."""
    producer, worker = await _pair()
    try:
        first = msg(args=[1])
        again = replace(first, args=[2])
        assert await producer.enqueue([first]) == [first.id]
        assert await producer.enqueue([again]) == [first.id]
        got = await worker.fetch(["default"], 10, 30.0, 5.0)
        assert [(d.id, d.message.args if d.message else None) for d in got] == [(first.id, [1])]
        await worker.ack(got)
        assert await worker.fetch(["default"], 10, 30.0, 1.0) == []
    finally:
        await worker.close()
        await producer.close()


async def test_a_bulk_enqueue_whose_later_chunk_fails_leaves_no_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks' records are written while later chunks' copies are sent: a
    failure in one forgets the records the others wrote, and every copy
    sent is dropped, none run."""
    producer, worker = await _pair()
    try:
        ms = [msg() for _ in range(2 * CHUNK + 7)]
        real = producer.state.kv_update_known
        calls: list[int] = []

        async def second_fails(keys: list[str], decide: Decide, believed: Any) -> Any:
            calls.append(len(keys))
            if len(calls) == 2:
                raise dw.BrokerUnavailable("the state store is down")
            return await real(keys, decide, believed)

        monkeypatch.setattr(producer.state, "kv_update_known", second_fails)
        with pytest.raises(dw.BrokerUnavailable, match="state store is down"):
            await producer.enqueue(ms)
        assert len(calls) == 3  # the others were written (and then forgotten)
        assert await worker.state.kv_get([worker.names.job + m.id for m in ms]) == {}
        worker.record_grace = 0.0
        assert await worker.fetch(["default"], 500, 30.0, 3.0) == []
    finally:
        await worker.close()
        await producer.close()
