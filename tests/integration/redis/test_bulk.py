"""Bulk enqueue: staged chunks, one commit, all or nothing (see bulk.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.redis import RedisBroker, bulk
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.errors import PayloadTooLarge
from dumbwaiter.message import Message, decode
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import error, fetch_all

from .conftest import RedisServer

N = bulk.CHUNK * 3 + 500  # four chunks: three staged while the next is encoded


def _keys(server: RedisServer) -> list[bytes]:
    client = redis.Redis(port=server.port)
    try:
        return sorted(client.scan_iter(count=1000))
    finally:
        client.close()


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port)


class Boom(Exception):
    pass


def _failing(n: int, after: int) -> Iterator[Message]:
    for i in range(n):
        if i == after:
            raise Boom("the caller's iterator failed")
        yield msg(args=[i])


async def test_a_big_batch_is_stored_whole_in_order(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        ms = [msg(args=[i]) for i in range(N)]
        assert await broker.enqueue(iter(ms)) == [m.id for m in ms]
        got = [d.message.args[0] for d in await fetch_all(broker) if d.message]
        assert got == list(range(N))
        assert not [k for k in _keys(redis_server) if b":stage" in k]
    finally:
        await broker.close()


@pytest.mark.parametrize("after", [10, bulk.CHUNK + 10, 3 * bulk.CHUNK + 10])
async def test_a_failing_iterator_stores_nothing(redis_server: RedisServer, after: int) -> None:
    broker = from_url(redis_server.url())
    try:
        with pytest.raises(Boom):
            await broker.enqueue(_failing(N, after))
        assert await broker.stats() == [] or (await broker.stats())[0].ready == 0
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
    finally:
        await broker.close()


def test_a_failing_iterator_stores_nothing_sync(redis_server: RedisServer) -> None:
    app = dw.App(redis_server.url())
    try:
        with pytest.raises(Boom):
            app.broker.enqueue_sync(_failing(N, 2 * bulk.CHUNK + 1))
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
    finally:
        app.close()


async def test_a_message_too_large_half_way_stores_nothing(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    broker.max_message_size = 1000
    ms = [msg(args=[i]) for i in range(N)]
    ms[2 * bulk.CHUNK + 7] = msg(args=["x" * 2000])
    try:
        with pytest.raises(PayloadTooLarge):
            await broker.enqueue(ms)
        assert not [k for k in _keys(redis_server) if b":job:" in k]
    finally:
        await broker.close()


async def test_keys_in_a_big_batch_hold(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    try:
        first = msg(key="k-early")
        await broker.enqueue([first])
        ms = [msg(args=[i]) for i in range(N)]
        ms[5] = msg(key="k-early")  # held by the job enqueued before
        ms[bulk.CHUNK + 3] = msg(key="k-twice")
        ms[3 * bulk.CHUNK + 3] = msg(key="k-twice")  # held by the one above
        ids = await broker.enqueue(ms)
        assert ids[5] == first.id
        assert ids[3 * bulk.CHUNK + 3] == ms[bulk.CHUNK + 3].id
        assert [i for k, i in enumerate(ids) if k not in (5, 3 * bulk.CHUNK + 3)] == [
            m.id for k, m in enumerate(ms) if k not in (5, 3 * bulk.CHUNK + 3)
        ]
        assert len(await fetch_all(broker)) == N - 2 + 1
    finally:
        await broker.close()


def _flushing(server: RedisServer, n: int, at: int) -> Iterator[Message]:
    """Flush the server's scripts while the batch is being staged."""
    for i in range(n):
        if i == at:
            client = _client(server)
            client.script_flush()
            client.close()
        yield msg(args=[i])


def _killing(server: RedisServer, n: int, at: int) -> Iterator[Message]:
    """Drop every client connection while the batch is being staged."""
    for i in range(n):
        if i == at:
            client = _client(server)
            client.client_kill_filter(_type="normal", skipme=True)
            client.close()
        yield msg(args=[i])


@pytest.mark.parametrize("trouble", [_flushing, _killing], ids=["script-flush", "client-kill"])
def test_trouble_while_staging_falls_back_and_stores_each_job_once(
    redis_server: RedisServer, trouble: Callable[[RedisServer, int, int], Iterator[Message]]
) -> None:
    app = dw.App(redis_server.url())
    try:
        ids = app.broker.enqueue_sync(trouble(redis_server, N, 2 * bulk.CHUNK + 5))
    finally:
        app.close()
    assert len(ids) == len(set(ids)) == N
    client = _client(redis_server)
    try:
        assert client.zcard("{dw:t}:ready:default") == N
        assert client.zcard("{dw:t}:ids") == N
    finally:
        client.close()
    assert not [k for k in _keys(redis_server) if b":stage" in k]


async def test_what_a_dead_producer_staged_is_deleted(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        chunk = next(bulk.encode([msg() for _ in range(10)], None))
        link = broker.conn.links.get()
        await link.script(
            broker.lua.enqueue,
            broker.conn.keys.scripts,
            [repr(time.time()), b"stage1", "call-1", repr(time.time() - 1), *chunk.args],
        )
        assert [k for k in _keys(redis_server) if b":job:" in k]
        await broker.rescue()
        assert not [k for k in _keys(redis_server) if b":job:" in k or b":stage" in k]
        assert await broker.fetch(["default"], 100, 30.0, 0) == []
    finally:
        await broker.close()


# -- admin operations between the staging and the commit of a bulk enqueue --
#
# A staged job is stored but not yet enqueued: the producer has not been told
# it exists, and it may still be deleted (unstage).  Whatever an admin
# operation does to it in that window must leave each job with one place at
# most (one ready entry, or its scheduled entry), leased once at a time, and
# must not run a job the producer is then told was never stored.

STAGED = 20


async def _stage(broker: RedisBroker, call: str, ms: list[Message]) -> None:
    """Store ``ms`` as the first chunk of bulk enqueue ``call`` (not committed)."""
    chunk = next(bulk.encode(ms, None))
    await broker.conn.links.get().script(
        broker.lua.enqueue,
        broker.conn.keys.scripts,
        [repr(time.time()), b"stage1", call, repr(time.time() + bulk.STAGE_TTL), *chunk.args],
    )


async def _commit(broker: RedisBroker, call: str) -> None:
    await broker.conn.links.get().script(
        broker.lua.commit, broker.conn.keys.scripts, [repr(time.time()), call]
    )


async def _unstage(broker: RedisBroker, call: str) -> None:
    await broker.conn.links.get().script(broker.lua.unstage, broker.conn.keys.scripts, [call])


def _zcard(server: RedisServer, key: str) -> int:
    client = _client(server)
    try:
        return int(client.zcard("{dw:t}:" + key))
    finally:
        client.close()


async def test_rescheduling_staged_jobs_to_now_leases_each_once(
    redis_server: RedisServer,
) -> None:
    """The reported double run: a reschedule to now between staging and
    commit, then the commit, must not leave two ready entries for a job."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        ms = [msg(args=[i]) for i in range(STAGED)]
        ids = [m.id for m in ms]
        await _stage(broker, "call-1", ms)
        await broker.reschedule(ids, time.time())
        await _commit(broker, "call-1")
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert sorted(got) == sorted(ids)  # each leased once, none lost
        assert _zcard(redis_server, "ready:default") == 0
    finally:
        await broker.close()


async def test_a_staged_job_rescheduled_fetched_and_retried_is_not_published_twice(
    redis_server: RedisServer,
) -> None:
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        ms = [msg(args=[i]) for i in range(STAGED)]
        await _stage(broker, "call-1", ms)
        await broker.reschedule([m.id for m in ms], time.time())
        first = await broker.fetch(["default"], 100, 30.0, 0)
        for d in first:
            d.error, d.retry_at = error(), time.time()
        await broker.retry(first)
        await _commit(broker, "call-1")
        assert _zcard(redis_server, "ready:default") == STAGED
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert sorted(got) == sorted(m.id for m in ms)
    finally:
        await broker.close()


async def test_admin_operations_treat_staged_jobs_as_not_yet_enqueued(
    redis_server: RedisServer,
) -> None:
    """get, list, cancel, reschedule (now or later), purge and replay do not
    see or touch a staged job; the commit then publishes every job once, at
    the time its enqueue gave it."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        later = time.time() + 3600
        ready = [msg(args=[i]) for i in range(STAGED)]
        sched = [msg(args=[i], eta=later) for i in range(STAGED)]
        await _stage(broker, "call-1", ready + sched)
        ids = [m.id for m in ready + sched]
        assert await broker.get(ids[0]) is None
        assert await broker.get(ids[-1]) is None
        assert (await broker.list_jobs(JobFilter())).items == []
        assert await broker.cancel(ids[:2]) == []
        assert await broker.reschedule(ids, time.time()) == []
        assert await broker.reschedule(ids, later + 60) == []
        assert await broker.purge(JobFilter()) == 0
        assert await broker.purge(JobFilter(ids=tuple(ids))) == 0
        assert await broker.replay(JobFilter()) == 0
        await _commit(broker, "call-1")
        assert _zcard(redis_server, "ready:default") == STAGED
        assert _zcard(redis_server, "sched:default") == STAGED
        client = _client(redis_server)
        try:
            due = {m.id.encode(): s for m, s in zip(sched, [later] * STAGED, strict=True)}
            scored = client.zrange("{dw:t}:sched:default", 0, -1, withscores=True)
            for member, score in cast(list[tuple[bytes, float]], scored):
                assert score == pytest.approx(due[member])
        finally:
            client.close()
        assert None not in [await broker.get(i) for i in ids]
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert sorted(got) == sorted(m.id for m in ready)
    finally:
        await broker.close()


async def test_unstaging_deletes_no_job_that_an_admin_operation_reached(
    redis_server: RedisServer,
) -> None:
    """A reschedule to now, a fetch, then the producer's iterator fails: the
    undo must not delete a job a worker holds (or leave it half there)."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        ms = [msg(args=[i]) for i in range(STAGED)]
        await _stage(broker, "call-1", ms)
        await broker.reschedule([m.id for m in ms], time.time())
        running = await broker.fetch(["default"], 100, 30.0, 0)
        await _unstage(broker, "call-1")
        for d in running:  # whatever a worker holds stays a whole job
            assert await broker.get(d.id) is not None
        assert not [k for k in _keys(redis_server) if b":stage" in k]
        stats = await broker.stats()
        assert all(s.running == len(running) for s in stats)
    finally:
        await broker.close()


async def test_fetch_drops_a_ready_member_whose_job_is_not_ready(
    redis_server: RedisServer,
) -> None:
    """The last line of defence: a second ready-set member for a job that is
    already leased (however it got there) is dropped, not claimed again."""
    broker = from_url(redis_server.url())
    try:
        m = msg()
        await broker.enqueue([m])
        [d] = await broker.fetch(["default"], 10, 30.0, 0)
        client = _client(redis_server)
        try:
            client.zadd("{dw:t}:ready:default", {f"{0:016d}{m.id}": 0})
        finally:
            client.close()
        assert await broker.fetch(["default"], 10, 30.0, 0) == []
        assert _zcard(redis_server, "ready:default") == 0
        assert (await broker.stats())[0].running == 1
        await broker.ack([d])
    finally:
        await broker.close()


async def test_a_commit_publishes_only_the_staged_jobs_still_stored(
    redis_server: RedisServer,
) -> None:
    """The commit's slow path (a listed job is gone; nothing in dumbwaiter
    deletes one, so the key is deleted by hand): the others are published,
    the gone one is not stored again as a stub."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        ms = [msg(args=[i]) for i in range(STAGED)]
        await _stage(broker, "call-1", ms)
        client = _client(redis_server)
        try:
            client.delete(f"{{dw:t}}:job:{ms[3].id}")
            await _commit(broker, "call-1")
            assert not client.exists(f"{{dw:t}}:job:{ms[3].id}")
        finally:
            client.close()
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert sorted(got) == sorted(m.id for k, m in enumerate(ms) if k != 3)
    finally:
        await broker.close()


@pytest.mark.parametrize("unique", ["queued", "active"])
async def test_a_staged_job_holds_its_key(redis_server: RedisServer, unique: str) -> None:
    """bulk.py stages no keyed chunk, but the script may: a staged holder of a
    key blocks a new job as the queued job it becomes would."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        staged = msg(key="k-1", headers={"unique": unique})
        await _stage(broker, "call-1", [staged])
        assert await broker.enqueue([msg(key="k-1", headers={"unique": unique})]) == [staged.id]
        await _commit(broker, "call-1")
        assert [d.id for d in await fetch_all(broker)] == [staged.id]
    finally:
        await broker.close()


# -- a plain enqueue of a job another producer's bulk enqueue has staged --


async def test_a_job_enqueued_while_a_bulk_enqueue_staged_it_survives_the_undo(
    redis_server: RedisServer,
) -> None:
    """Producer B enqueues a job (same id) that producer A's bulk enqueue has
    staged; then A's iterator fails and A undoes its batch.  B was told its
    job is enqueued: it must stay, and run once."""
    a, b = from_url(redis_server.url()), from_url(redis_server.url())
    try:
        ms = [msg(args=[i]) for i in range(N)]

        def source() -> Iterator[Message]:
            for i, m in enumerate(ms):
                if i == 2 * bulk.CHUNK + 1:  # the first chunk is staged (its reply read)
                    assert b.enqueue_sync([ms[0]]) == [ms[0].id]  # enqueue_one.lua
                    assert b.enqueue_sync([ms[1], ms[2]]) == [ms[1].id, ms[2].id]  # enqueue.lua
                    raise Boom("the caller's iterator failed")
                yield m

        with pytest.raises(Boom):
            await a.enqueue(source())
        for m in ms[:3]:
            info = await a.get(m.id)
            assert info is not None and info.state is State.READY
        assert sorted(d.id for d in await fetch_all(a)) == sorted(m.id for m in ms[:3])
        assert not [k for k in _keys(redis_server) if b":stage" in k]
    finally:
        await a.close()
        await b.close()


async def test_a_commit_after_a_plain_enqueue_took_a_staged_job_publishes_it_once(
    redis_server: RedisServer,
) -> None:
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        later = time.time() + 3600
        ready = [msg(args=[i]) for i in range(STAGED)]
        sched = [msg(args=[i], eta=later) for i in range(STAGED)]
        await _stage(broker, "call-1", ready + sched)
        await _stage(broker, "call-2", [msg()])  # another open bulk enqueue
        assert await broker.enqueue([ready[3]]) == [ready[3].id]
        assert await broker.enqueue([sched[4], ready[5]]) == [sched[4].id, ready[5].id]
        info = await broker.get(ready[3].id)
        assert info is not None and info.state is State.READY  # enqueued now, not at commit
        await _commit(broker, "call-1")
        assert _zcard(redis_server, "ready:default") == STAGED
        assert _zcard(redis_server, "sched:default") == STAGED
        got = [d.id for d in await fetch_all(broker)]
        assert sorted(got) == sorted(m.id for m in ready)  # each leased once
        await _unstage(broker, "call-2")
        assert not [k for k in _keys(redis_server) if b":stage" in k]
    finally:
        await broker.close()


@pytest.mark.parametrize("first", ["commits", "undoes"])
async def test_a_bulk_enqueue_of_jobs_another_bulk_enqueue_staged_enqueues_them(
    redis_server: RedisServer, first: str
) -> None:
    """Two producers' bulk enqueues share ids: B's completes while A's is
    still open.  B was told every job of its batch is enqueued, so whatever
    A does next (commit, or undo after its iterator failed), each of them
    is there, once."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        ms = [msg(args=[i]) for i in range(N)]
        shared = ms[: STAGED // 2] + ms[bulk.CHUNK + 1 : bulk.CHUNK + 1 + STAGED // 2]
        await _stage(broker, "call-a", [*shared, msg()])  # A: staged, not committed
        assert await broker.enqueue(iter(ms)) == [m.id for m in ms]  # B, staged way
        for m in shared:
            info = await broker.get(m.id)
            assert info is not None and info.state is State.READY
        await (_commit if first == "commits" else _unstage)(broker, "call-a")
        got = [d.id for d in await fetch_all(broker)]
        assert len(got) == len(set(got))  # each leased once
        expected = {m.id for m in ms}
        assert expected <= set(got) and len(got) == N + (first == "commits")
        assert not [k for k in _keys(redis_server) if b":stage" in k]
    finally:
        await broker.close()


# -- what a producer that died left staged --


# The ready jobs of a staged chunk have their ready-set members written as
# they are staged, in a set of the call's own (`stage:<call>:r:<queue>`),
# which the commit moves into the queue's ready set whole (see publish_staged
# in _lib.lua).


def _members(server: RedisServer) -> list[bytes]:
    return [k for k in _keys(server) if b":r:" in k]


@pytest.mark.parametrize("before", [0, 5, bulk.CHUNK + 1])
async def test_a_big_batch_joins_the_ready_jobs_of_its_queue_in_order(
    redis_server: RedisServer, before: int
) -> None:
    """Into an empty ready set (renamed whole), a small one (merged) and a
    backlog (no member set staged: the commit adds them one by one): every
    job once, oldest first, and the ready set keeps no expiry."""
    broker = from_url(redis_server.url())
    try:
        early = [msg(args=[-1 - i]) for i in range(before)]
        if early:
            await broker.enqueue(early)
        ms = [msg(args=[i]) for i in range(N)]
        await broker.enqueue(iter(ms))
        assert _zcard(redis_server, "ready:default") == before + N
        assert not _members(redis_server)
        client = _client(redis_server)
        try:
            assert client.ttl("{dw:t}:ready:default") == -1
        finally:
            client.close()
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert got == [m.id for m in early + ms]
    finally:
        await broker.close()


async def test_a_commit_hands_the_first_staged_jobs_to_an_idle_worker(
    redis_server: RedisServer,
) -> None:
    """A worker waiting on the queue gets the batch's first jobs, leased, in
    its inbox (up to its limit); the rest are ready, each job once."""
    waiter, producer = from_url(redis_server.url()), from_url(redis_server.url())
    assert isinstance(waiter, RedisBroker) and isinstance(producer, RedisBroker)
    try:
        await waiter.keyspace("default")._claim(
            ["default"], 10, 30.0, "w-idle", "w9", time.time() + 30
        )
        ms = [msg(args=[i]) for i in range(N)]
        await producer.enqueue(iter(ms))
        [raw] = await producer.conn.links.get().call(
            b"LRANGE", producer.conn.keys.inbox("w9"), 0, -1
        )
        handed = [job[0] for job in json.loads(raw)]
        assert handed == [m.id for m in ms[:10]]
        for m in ms[:10]:
            info = await producer.get(m.id)
            assert info is not None and info.state is State.RUNNING and info.worker == "w-idle"
        assert (await producer.stats())[0].running == 10
        got = [d.message.id for d in await fetch_all(producer) if d.message]
        assert got == [m.id for m in ms[10:]]
        assert not _members(redis_server)
    finally:
        await waiter.close()
        await producer.close()


async def _stage_all(broker: RedisBroker, call: str, ms: list[Message]) -> None:
    """Stage every chunk of ``ms`` as bulk enqueue ``call`` (not committed)."""
    for i, chunk in enumerate(bulk.encode(ms, None)):
        first = i == 0
        await broker.conn.links.get().script(
            broker.lua.enqueue,
            broker.conn.keys.scripts,
            [
                repr(time.time()),
                b"stage1" if first else b"stage",
                call,
                repr(time.time() + bulk.STAGE_TTL) if first else "",
                *chunk.args,
            ],
        )


async def test_a_commit_into_a_ready_set_that_grew_bigger_adds_every_member(
    redis_server: RedisServer,
) -> None:
    """Staged into an empty queue, committed after another producer filled
    it with more ready jobs than the batch holds: the members are added to
    the ready set (in slices: more than unpack takes at once), each job once,
    oldest first."""
    broker = from_url(redis_server.url())
    assert isinstance(broker, RedisBroker)
    try:
        staged = [msg(args=[i]) for i in range(5 * bulk.CHUNK)]
        await _stage_all(broker, "call-slow", staged)
        others = [msg(args=[-i]) for i in range(6 * bulk.CHUNK)]
        await broker.enqueue(iter(others))
        await _commit(broker, "call-slow")
        assert _zcard(redis_server, "ready:default") == len(staged) + len(others)
        assert not [k for k in _keys(redis_server) if b":stage" in k]
        got = [d.message.id for d in await fetch_all(broker) if d.message]
        assert sorted(got) == sorted(m.id for m in staged + others)
        assert [i for i in got if i in {m.id for m in staged}] == [m.id for m in staged]
    finally:
        await broker.close()


async def test_a_small_batch_hands_its_first_jobs_to_an_idle_worker(
    redis_server: RedisServer,
) -> None:
    """A batch of one chunk (one plain script call, its loop for new jobs
    without keys) gives an idle worker its first jobs, leased, with their
    bodies, and puts the rest in the ready set in order; a scheduled batch
    and a batch with an id already stored take the general loop."""
    waiter, producer = from_url(redis_server.url()), from_url(redis_server.url())
    assert isinstance(waiter, RedisBroker) and isinstance(producer, RedisBroker)
    try:
        await waiter.keyspace("default")._claim(
            ["default"], 3, 30.0, "w-idle", "w9", time.time() + 30
        )
        ms = [msg(args=[i]) for i in range(8)]
        assert await producer.enqueue(iter(ms)) == [m.id for m in ms]
        [raw] = await producer.conn.links.get().call(
            b"LRANGE", producer.conn.keys.inbox("w9"), 0, -1
        )
        handed = json.loads(raw)
        assert [job[0] for job in handed] == [m.id for m in ms[:3]]
        assert [decode(job[3]).args for job in handed] == [[0], [1], [2]]
        for m in ms:
            info = await producer.get(m.id)
            want = State.RUNNING if m in ms[:3] else State.READY
            assert info is not None and info.state is want
        again = [msg(args=[99]), ms[5]]  # one new, one stored: nothing stored twice
        assert await producer.enqueue(iter(again)) == [m.id for m in again]
        later = [msg(args=[i], eta=time.time() + 3600) for i in range(3)]
        await producer.enqueue(iter(later))
        [st] = await producer.stats()
        assert (st.running, st.ready, st.scheduled) == (3, 6, 3)
        got = [d.message.args[0] for d in await fetch_all(producer) if d.message]
        assert got == [3, 4, 5, 6, 7, 99]
    finally:
        await waiter.close()
        await producer.close()


async def test_single_and_bulk_enqueues_share_one_oldest_first_order(
    redis_server: RedisServer,
) -> None:
    # a one-job enqueue's ready member is built by the producer
    # (enqueue_one.lua), a batch's by enqueue.lua: both must sort together,
    # oldest first within a priority, and priority first, both ways
    broker = from_url(redis_server.url())
    try:
        first = msg(args=["one-1"])
        batch = [msg(args=[f"many-{i}"]) for i in range(3)]
        last = msg(args=["one-2"])
        urgent = msg(args=["urgent"], priority=5)
        late = msg(args=["late"], priority=-1)
        for group in ([first], batch, [last], [late], [urgent]):
            broker.enqueue_sync(group)
        got = [d.message.args[0] for d in await fetch_all(broker) if d.message]
        assert got == ["urgent", "one-1", "many-0", "many-1", "many-2", "one-2", "late"]
    finally:
        await broker.close()
