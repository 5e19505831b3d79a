"""The NATS broker's own behaviour, beyond the conformance suite: subject
encoding, the protocol parser, JetStream redelivery as the lease backstop,
stale pull requests, pointer bookkeeping, kv expiry and repairs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker, KvWrite
from dumbwaiter.brokers.nats import NatsBroker
from dumbwaiter.brokers.nats import records as R
from dumbwaiter.brokers.nats.names import key_of, key_tokens, parse_url, tok, untok
from dumbwaiter.brokers.nats.protocol import (
    WRONG_LAST_SEQUENCE,
    JetStreamError,
    PubAck,
    Reply,
    _Parser,
    header,
    headers,
    pub_ack,
)
from dumbwaiter.brokers.nats.store import parse_time
from dumbwaiter.brokers.types import JobFilter, QueueStats
from dumbwaiter.cli import main as cli_main
from dumbwaiter.errors import BrokerError, InvalidURL
from dumbwaiter.message import ErrorRecord, encode
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually, fetch_all
from tests.integration.nats.server import connect


@pytest.fixture
async def make(shared_url: str) -> AsyncIterator[Callable[..., NatsBroker]]:
    """Brokers on the test's namespace; extra URL options per broker."""
    made: list[Broker] = []

    def make(**options: str) -> NatsBroker:
        url = shared_url + "".join(f"&{k}={v}" for k, v in options.items())
        b = from_url(url)
        assert isinstance(b, NatsBroker)
        made.append(b)
        return b

    yield make
    for b in made:
        await b.close()


# -- names, parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["default", "group:email", "a.b c*>", "", "ü/ñ=", "=41", "-_", "x" * 200]
)
def test_tokens_are_valid_subject_tokens_and_reversible(text: str) -> None:
    t = tok(text)
    assert t and all(c not in t for c in b". *>\t\r\n")
    assert untok(t) == text


def test_kv_keys_split_at_colons_for_prefix_scans() -> None:
    key = "inbox:group:email:01a2-b3"
    assert key_tokens(key) == b"inbox.group.email.01a2-b3"
    assert key_of(key_tokens(key)) == key
    assert key_of(key_tokens("a::b:")) == "a::b:"


def test_url_options_and_errors() -> None:
    s = parse_url("nats://u:p%40ss@h1:4223,h2/app?ack_wait=5&retention=60&storage=memory")
    assert s.servers == ["nats://h1:4223", "nats://h2:4222"]
    assert (s.ns, s.user, s.password, s.ack_wait, s.retention, s.storage) == (
        "app", "u", "p@ss", 5.0, 60.0, "memory",
    )  # fmt: skip
    assert parse_url("nats://127.0.0.1:4222?prefix=x").ns == "x"
    with pytest.raises(InvalidURL, match="unknown option 'bogus'"):
        parse_url("nats://h?bogus=1")
    with pytest.raises(InvalidURL, match="namespace"):
        parse_url("nats://h?prefix=a.b")
    with pytest.raises(InvalidURL, match="storage"):
        parse_url("nats://h?storage=tape")


def test_server_timestamps_parse_to_unix_seconds() -> None:
    assert parse_time(b"2026-11-29T18:27:57.344063103Z") == pytest.approx(1795976877.344063)
    assert parse_time(b"2026-11-29T19:27:57+01:00") == pytest.approx(1795976877.0)


async def test_parser_handles_any_split_of_the_stream() -> None:
    """Messages, headers, pings and payloads arriving a byte at a time."""
    got: list[tuple[bytes, bytes, bytes | None, bytes]] = []
    other: list[Any] = []

    class NC:
        async def _process_msg(self, *a: Any) -> None:
            other.append(a)

        async def _process_ping(self) -> None:
            other.append("ping")

        async def _process_pong(self) -> None:
            other.append("pong")

        async def _process_info(self, info: Any) -> None:
            other.append(info)

    hdr = headers((b"Dw-Id", b"x1"), (b"Dw-G", 0))
    stream = (
        b'INFO {"max_payload":1}\r\nPING\r\n'
        + b"MSG a.b 7 r.x 5\r\nhello\r\n"
        + b"HMSG c 7 %d %d\r\n%sbody\r\n" % (len(hdr), len(hdr) + 4, hdr)
        + b"MSG other 9 3\r\nabc\r\n+OK\r\nPONG\r\n"
        + b"MSG e 7 0\r\n\r\n"
    )
    p = _Parser(NC(), {7: lambda s, r, h, d: got.append((s, r, h, d))})
    for i in range(len(stream)):
        await p.parse(stream[i : i + 1])
    assert got == [
        (b"a.b", b"r.x", None, b"hello"),
        (b"c", b"", hdr, b"body"),
        (b"e", b"", None, b""),
    ]
    assert header(got[1][2], b"Dw-Id") == b"x1" and header(got[1][2], b"Dw-G") == b"0"
    assert other == [{"max_payload": 1}, "ping", (9, b"other", b"", b"abc", None), "pong"]


@pytest.mark.parametrize(
    ("data", "ack"),
    [
        (b'{"stream":"S","seq":5}', PubAck(5, False)),
        (b'{"stream":"S","seq":5,"duplicate": true}', PubAck(5, True)),  # nats-server's
        (b'{"stream":"S","seq":5,"duplicate":true}', PubAck(5, True)),
        (b'{"stream":"S","domain":"d","seq":7}', PubAck(7, False)),
        (b'{"stream":"S", "seq": 9 }', PubAck(9, False)),  # other spacing: read as JSON
        (b'{"stream":"S","seq":9,"duplicate":false}', PubAck(9, False)),
    ],
)
def test_pub_acks_are_read_with_and_without_json(data: bytes, ack: PubAck) -> None:
    assert pub_ack(Reply(None, data), "x") == ack


def test_a_pub_ack_error_raises_with_its_code() -> None:
    data = (
        b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},'
        b'"stream":"S","seq":0}'
    )
    with pytest.raises(JetStreamError) as e:
        pub_ack(Reply(None, data), "claim")
    assert e.value.err_code == WRONG_LAST_SEQUENCE


# -- JetStream as the lease's backstop --------------------------------------------


async def test_a_job_redelivered_after_ack_wait_is_rescued_by_the_fetch_that_gets_it(
    make: Callable[..., NatsBroker],
) -> None:
    """No rescue() runs: JetStream redelivers the pointer after AckWait and the
    fetch records the lost lease itself."""
    b = make(ack_wait="1")
    await b.open()
    m = msg()
    await b.enqueue([m])
    [d] = await b.fetch(["default"], 1, 0.2, 0, "w-dead")
    [again] = await asyncio.wait_for(b.fetch(["default"], 1, 30.0, 10.0, "w-new"), 15)
    assert again.id == m.id and again.message is not None and again.message.attempt == 2
    [err] = again.message.errors
    assert err.type.endswith("LeaseExpired") and err.worker == "w-dead"
    await b.ack([d])  # the first worker, late: fenced off
    info = await b.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-new"


async def test_a_job_a_fetch_dead_letters_is_reported_by_the_next_rescue(
    make: Callable[..., NatsBroker],
) -> None:
    """JetStream redelivers the last attempt of a dead worker's job: the fetch
    buries it, and the next ``rescue()`` reports it (once), for ``on_dead``."""
    b = make(ack_wait="1")
    await b.open()
    m = msg(max_attempts=1)
    await b.enqueue([m])
    await b.fetch(["default"], 1, 0.2, 0, "w-dead")

    async def judged() -> State | None:
        assert await b.fetch(["default"], 1, 30.0, 0.5, "w-new") == []
        info = await b.get(m.id)
        return None if info is None else info.state

    await eventually(judged, lambda st: st is State.DEAD, timeout=15.0)
    r = await b.rescue()
    assert r == 1 and [(d.id, d.queue, d.name) for d in r.dead] == [(m.id, "default", m.name)]
    assert r.dead[0].error.type.endswith("LeaseExpired") and r.dead[0].error.worker == "w-dead"
    assert (await b.rescue()).dead == ()


async def test_a_live_workers_job_redelivered_by_jetstream_is_not_taken(
    make: Callable[..., NatsBroker],
) -> None:
    """AckWait shorter than the lease: the redelivery is held back, not claimed."""
    b = make(ack_wait="1")
    await b.open()
    await b.enqueue([msg()])
    [d] = await b.fetch(["default"], 1, 60.0, 0, "w-alive")
    assert await b.fetch(["default"], 1, 30.0, 2.0, "w-other") == []
    await b.ack([d])
    assert (await b.get(d.id)).state is State.SUCCEEDED  # type: ignore[union-attr]


async def test_what_a_cancelled_long_poll_receives_goes_to_the_next_fetcher(
    make: Callable[..., NatsBroker],
) -> None:
    """The cancelled fetch's pull request stays on the server and takes the next
    job; that process hands it back within GRACE instead of sitting on it."""
    a, b = make(), make()
    await a.open()
    await b.open()
    waiting = asyncio.create_task(a.fetch(["default"], 10, 30.0, 30.0))
    link = await b._link()
    consumer = f"CONSUMER.INFO.{b.n.work}.{b.n.consumer('default', 0)}"

    async def parked() -> int:
        try:
            return int((await link.wire.api(consumer)).get("num_waiting", 0))
        except Exception:  # the consumer is made by the fetch's first pull
            return 0

    await eventually(parked, lambda n: n >= 1)  # the long poll is on the server
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    m = msg()
    await b.enqueue([m])
    [d] = await asyncio.wait_for(b.fetch(["default"], 10, 30.0, 10.0), 15)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1


async def test_what_was_just_stored_is_fetched_without_waiting(
    make: Callable[..., NatsBroker],
) -> None:
    """nats-server tells a consumer about a stored message asynchronously, so a
    bare ``no_wait`` pull sent right after the PubAck is sometimes answered
    "no messages" (a few in a thousand on a loaded machine; the conformance
    suite's requeue-then-fetch failed that way).  ``fetch(wait=0)`` must still
    see every job that an enqueue or a requeue has returned for."""
    b = make()
    await b.open()
    for _ in range(400):
        await b.enqueue([msg()])
        [d] = await b.fetch(["default"], 1, 30.0, 0)
        await b.requeue([d])
        [d] = await b.fetch(["default"], 1, 30.0, 0)
        await b.ack([d])
    assert await b.fetch(["default"], 1, 30.0, 0) == []


# -- pointer bookkeeping ---------------------------------------------------------------


async def test_cancel_takes_the_pointer_out_even_after_the_dedupe_window(
    make: Callable[..., NatsBroker],
) -> None:
    """Within the window a pointer is found by its Nats-Msg-Id, after it by time."""
    b = make(dupe_window="0.5")
    await b.open()
    old, new = msg(), msg()
    await b.enqueue([old])
    link = await b._link()

    async def in_window() -> bool:
        r = await link.wire.call(
            b.n.t + b"probe",
            b"",
            headers((b"Nats-Msg-Id", old.id), (b"Nats-Expected-Last-Sequence", 2**62)),
        )
        return b'"duplicate"' in r.data

    await eventually(in_window, lambda found: not found)  # the window passed
    await b.enqueue([new])
    assert sorted(await b.cancel([old.id, new.id])) == sorted([old.id, new.id])
    [s] = [s for s in await b.stats() if s.queue == "default"]
    assert (s.ready, s.cancelled) == (0, 2)
    assert await b.fetch(["default"], 10, 30.0, 0) == []


async def test_an_enqueue_stores_only_the_pointer_and_get_finds_the_job_by_it(
    make: Callable[..., NatsBroker],
) -> None:
    """One stored message per job: no index entry at enqueue; ``get``, a
    cancel and a listing find the fresh job through its pointer."""
    b = make()
    await b.open()
    a, c, later = msg(), msg(), msg(eta=time.time() + 60)
    await b.enqueue([a])
    await b.enqueue([c, later])
    link = await b._link()
    je = [b.n.je + m.id.encode() for m in (a, c, later)]
    entries = await link.store.read_many(b.n.jobs, je)
    assert [e is not None for e in entries] == [False, False, True]  # a delayed job keeps it
    info = await b.get(a.id)
    assert info is not None and info.state is State.READY and info.message.id == a.id
    assert info.updated_at is not None and abs(info.updated_at - time.time()) < 5
    assert await b.cancel([c.id]) == [c.id]
    assert (await b.get(c.id)).state is State.CANCELLED  # type: ignore[union-attr]
    page = await b.list_jobs(JobFilter(state=State.READY))
    assert [i.message.id for i in page.items] == [a.id]
    [d] = await b.fetch(["default"], 10, 30.0, 0)
    assert d.id == a.id
    await b.ack([d])
    assert (await b.get(a.id)).state is State.SUCCEEDED  # type: ignore[union-attr]


async def test_a_fresh_job_is_found_after_its_msg_id_left_the_dedupe_window(
    make: Callable[..., NatsBroker],
) -> None:
    """Past the window the pointer cannot be found by ``Nats-Msg-Id``: the
    index entries of older pointers are written then (by the get itself
    here; by rescue every second in a running worker)."""
    b = make(dupe_window="0.5")
    await b.open()
    m = msg()
    await b.enqueue([m])
    link = await b._link()

    async def in_window() -> bool:
        r = await link.wire.call(
            b.n.t + b"probe",
            b"",
            headers((b"Nats-Msg-Id", m.id), (b"Nats-Expected-Last-Sequence", 2**62)),
        )
        return b'"duplicate"' in r.data

    await eventually(in_window, lambda found: not found)  # the window passed
    assert await link.store.read(b.n.jobs, b.n.je + m.id.encode()) is None
    info = await b.get(m.id)
    assert info is not None and info.state is State.READY
    assert await link.store.read(b.n.jobs, b.n.je + m.id.encode()) is not None
    assert await b.cancel([m.id]) == [m.id]
    assert await b.fetch(["default"], 10, 30.0, 0) == []


async def test_rescue_indexes_pointers_before_their_msg_id_leaves_the_window(
    make: Callable[..., NatsBroker],
) -> None:
    b = make(dupe_window="1")
    await b.open()
    old = msg()
    await b.enqueue([old])
    link = await b._link()
    subject = b.n.je + old.id.encode()

    async def indexed() -> bool:
        await b.rescue()
        return await link.store.read(b.n.jobs, subject) is not None

    await eventually(indexed, bool)
    new = msg()
    await b.enqueue([new])
    await b.rescue()  # a pointer younger than half the window is left to its Msg-Id
    assert await link.store.read(b.n.jobs, b.n.je + new.id.encode()) is None
    assert (await b.get(new.id)).state is State.READY  # type: ignore[union-attr]


async def test_jobs_stored_by_the_previous_layout_are_served(
    make: Callable[..., NatsBroker],
) -> None:
    """Before one-message enqueues, every job had its index entry from the
    enqueue (``Dw-U``, ``Dw-Ra`` headers): such jobs are found and run."""
    b = make()
    await b.open()
    m = msg()
    link = await b._link()
    body = encode(m)
    mid = m.id.encode()
    ptr = ((b"Nats-Msg-Id", mid), (b"Dw-Id", mid), (b"Dw-G", b"0"))
    idx = ((b"Dw-U", repr(time.time() - 5)), (b"Dw-Ra", b"0"))
    await link.store.put(b.n.pointer("default", 0), body, None, ptr)
    await link.store.put(b.n.je + mid, body, None, idx)
    info = await b.get(m.id)
    assert info is not None and info.state is State.READY
    assert info.updated_at is not None and info.updated_at < time.time() - 4
    assert [i.message.id for i in (await b.list_jobs(JobFilter())).items] == [m.id]
    [d] = await b.fetch(["default"], 10, 30.0, 0)
    assert d.id == m.id and d.message is not None
    await b.ack([d])
    assert (await b.get(m.id)).state is State.SUCCEEDED  # type: ignore[union-attr]


async def test_an_index_entry_written_late_does_not_outlive_its_job(
    make: Callable[..., NatsBroker],
) -> None:
    """The catch-up may write a fresh job's entry while the job runs and
    finishes; the entry counts only for ``retention`` after the enqueue,
    so it never shows the job as waiting once its record expired."""
    b = make(retention="5")
    await b.open()
    m = msg()
    link = await b._link()
    idx = ((b"Dw-U", repr(time.time() - 6)), (b"Dw-Ra", b"0"))
    await link.store.put(b.n.je + m.id.encode(), encode(m), None, idx)
    assert await b.get(m.id) is None
    assert (await b.list_jobs(JobFilter())).items == []


async def test_the_index_cursor_starts_over_on_a_work_stream_made_anew(
    make: Callable[..., NatsBroker],
) -> None:
    """The cursor is a work-stream sequence; one beyond the stream's last
    (the streams were deleted and made again, the KV bucket kept) restarts."""
    b = make()
    await b.open()
    link = await b._link()
    await b._merge_config(link, b"idx", lambda _: 10**9)
    m = msg()
    await b.enqueue([m])
    assert [i.message.id for i in (await b.list_jobs(JobFilter())).items] == [m.id]
    assert int(await b._config(link, b"idx")) < 10**9


async def test_a_mover_that_died_between_record_and_pointer_is_repaired(
    make: Callable[..., NatsBroker],
) -> None:
    """A retry writes the record first, then the new pointer, then acks the old
    one.  If the process dies after the record, JetStream redelivers the old
    pointer; the fetch that finds it stale publishes the missing one."""
    b = make(ack_wait="1")
    await b.open()
    m = msg()
    await b.enqueue([m])
    [d] = await b.fetch(["default"], 1, 30.0, 0)
    link = await b._link()
    cur = await link.store.read(b.n.jobs, b.n.js + m.id.encode())
    assert cur is not None
    rec = R.loads(cur.data)
    rec.update({R.ST: "ready", R.GEN: R.new_gen(), R.RUN_AT: time.time(), R.BY: cur.seq})
    await link.store.put(b.n.js + m.id.encode(), R.dumps(rec), cur.seq)  # ... and "dies"
    [again] = await asyncio.wait_for(b.fetch(["default"], 1, 30.0, 10.0), 15)
    assert again.id == m.id and again.message is not None and again.message.attempt == 2
    await b.ack([d])  # the dead mover's delivery is fenced off
    await b.ack([again])
    assert (await b.get(m.id)).state is State.SUCCEEDED  # type: ignore[union-attr]


async def test_priority_levels_of_other_processes_are_learned(
    make: Callable[..., NatsBroker],
) -> None:
    consumer, producer = make(), make()
    await consumer.open()
    await producer.open()
    assert await consumer.fetch(["default"], 1, 30.0, 0) == []  # caches: level 0 only
    low, high = msg(priority=0), msg(priority=7)
    await producer.enqueue([low, high])

    async def first() -> str:
        ds = await consumer.fetch(["default"], 1, 30.0, 0)
        for d in ds:
            await consumer.requeue([d])
        return ds[0].id if ds else ""

    await eventually(first, lambda i: i == high.id)


# -- kv expiry ----------------------------------------------------------------------------


async def test_expired_kv_entries_are_deleted_by_the_sweep(
    make: Callable[..., NatsBroker],
) -> None:
    b = make()
    await b.open()
    await b.kv_set({"short:a": b"1", "short:b": b"2"}, ttl=0.1)
    await b.kv_set({"keep": b"3"})
    link = await b._link()
    assert set(await link.store.subjects(b.n.kv, b.n.k + b">")) == {
        b.n.k + b"short.a", b.n.k + b"short.b", b.n.k + b"keep",
    }  # fmt: skip
    await eventually(lambda: b.kv_get(["short:a"]), lambda d: d == {})  # reads see it gone
    await b._sweep_kv(link, now=time.time() + 180)  # the sweeper, once its minute is over
    assert set(await link.store.subjects(b.n.kv, b.n.k + b">")) == {b.n.k + b"keep"}
    assert await link.store.subjects(b.n.work, b.n.t + b"*") == {}


async def test_kv_update_writes_with_a_ttl_are_deleted_by_the_sweep(
    make: Callable[..., NatsBroker],
) -> None:
    """A ``kv_update``'s writes with a ttl (a key it read, compare-and-set,
    and one it only wrote, written after) leave the stream once the
    sweeper's minute is over, like ``kv_set``'s: not only hidden from reads."""
    b = make()
    await b.open()
    await b.kv_set({"upd:read": b"0"})

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], None]:
        return {"upd:read": (b"1", 0.1), "upd:blind": (b"2", 0.1), "keep": b"3"}, None

    await b.kv_update(["upd:read"], decide)
    link = await b._link()
    await eventually(lambda: b.kv_get(["upd:read", "upd:blind"]), lambda d: d == {})
    await b._sweep_kv(link, now=time.time() + 180)
    assert set(await link.store.subjects(b.n.kv, b.n.k + b">")) == {b.n.k + b"keep"}
    assert await link.store.subjects(b.n.work, b.n.t + b"*") == {}


async def test_the_coordination_store_is_a_kv_bucket(make: Callable[..., NatsBroker]) -> None:
    """Locks and kv live in the KV bucket ``dw_NS``: nats-py's ``KeyValue``
    (and ``nats kv``) read what the broker wrote."""
    b = make()
    await b.open()
    await b.kv_set({"inbox:a": b"hello"})
    token = await b.acquire("scheduler", "me", 30.0)
    assert token is not None
    nc = await connect()
    try:
        kv = await nc.jetstream().key_value(b.n.bucket)
        assert set(await kv.keys()) == {"k.inbox.a", "c.lock.scheduler"}
        assert (await kv.get("k.inbox.a")).value == b"hello"
    finally:
        await nc.close()


# -- names of anything --------------------------------------------------------------------


async def test_queues_keys_and_event_types_with_any_characters(
    make: Callable[..., NatsBroker],
) -> None:
    b = make()
    await b.open()
    q = "emails.high priority/ü*"
    m = msg(queue=q)
    await b.enqueue([m])
    [d] = await b.fetch([q], 1, 30.0, 0)
    assert d.id == m.id and d.queue == q
    await b.ack([d])
    assert {s.queue: s.succeeded for s in await b.stats()}[q] == 1
    await b.kv_set({"a:b.c": b"1", "a:b": b"2", "a:bc": b"3", "ab": b"4"})
    assert await b.kv_scan("a:b") == {"a:b.c": b"1", "a:b": b"2", "a:bc": b"3"}
    assert await b.kv_scan("a:b.") == {"a:b.c": b"1"}
    listed = await b.list_jobs(JobFilter(queue=q))
    assert [i.message.id for i in listed.items] == [m.id]


# -- what a dead process leaves behind ---------------------------------------------------


@pytest.mark.parametrize("compact", [False, True], ids=["whole", "compact"])
@pytest.mark.parametrize("list_written_meanwhile", [False, True])
async def test_a_job_settled_by_a_process_that_died_before_its_list_is_counted(
    make: Callable[..., NatsBroker], list_written_meanwhile: bool, compact: bool
) -> None:
    """The process wrote the final record, then died before rewriting its holder
    list: rescue sees the job listed as running, finds the record settled by
    that process, and counts it (nothing runs again).  With
    ``list_written_meanwhile``, another task of the process wrote the list
    while the settle was on its way (the job still running in it, the list
    newer than the record): the count is still owed.  The SIGKILL crash test
    found that one (a wall-clock comparison of list and record missed it).
    With ``compact``, the record is the compact one a task without
    ``keep_result`` leaves (no ack subject): counted alike."""
    dying, rescuer = make(), make()
    await dying.open()
    await rescuer.open()
    m = msg()
    await dying.enqueue([m])
    [d] = await dying.fetch(["default"], 1, 0.2, 0, "w-dying")
    link = await dying._link()
    listed = await link.store.read(dying.n.hold, dying.n.h + link.holder.id.encode())
    assert listed is not None and m.id in orjson.loads(listed.data)["run"]
    # the settle's record write, without the list write that follows it
    tok = d.token
    if compact:
        env = {"id": m.id, "name": m.name, "queue": m.queue, "attempt": 1}
        rec = R.compact_record(env, tok.gen, time.time(), tok.claim, 0, None)
    else:
        rec = dying._settled(d, tok, State.SUCCEEDED.value, time.time())
    rec[R.SETTLED_BY] = link.holder.id
    await link.store.put(dying.n.js + m.id.encode(), R.dumps(rec), tok.seq)
    if list_written_meanwhile:
        link.holder.dirty = True
        link.holder.write()
        await link.wire.flush()
        listed = await eventually(
            lambda: link.store.read(dying.n.hold, dying.n.h + link.holder.id.encode()),
            lambda cur: cur is not None and cur.seq != listed.seq,
        )
        assert listed is not None  # what the accept above waited for
        content = orjson.loads(listed.data)
        assert m.id in content["run"] and content["t"] > rec[R.UPDATED]
    await link.wire.close()  # "dies": its list still says running
    rescued: list[int] = []

    async def rescue() -> Any:
        rescued.append(await rescuer.rescue())
        return await rescuer.stats()

    await eventually(rescue, lambda ss: [(s.succeeded, s.running) for s in ss] == [(1, 0)])
    assert set(rescued) == {0}  # nothing was given back to run again
    info = await rescuer.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and info.compact is compact


@pytest.mark.parametrize("late", ["ack", "retry", "extend"])
@pytest.mark.parametrize("given_back", ["rescue", "redelivery"])
async def test_a_job_this_process_claims_again_is_counted_whatever_its_first_claim_does_late(
    make: Callable[..., NatsBroker], given_back: str, late: str
) -> None:
    """A process' first delivery of a job lost its lease (its outcome waited
    to be written: a worker's settles in their backoff after a network cut),
    the job was given back (by a rescue, or JetStream delivered its pointer
    again after AckWait) and the same process claimed it again.  The first
    delivery's late settle (or heartbeat) is fenced off; it used to take the
    job out of the process' holder list anyway, the entry the second claim
    had kept (the list was per job), and the second run's ack then found
    nothing to count: ``stats`` stayed one success short for good (the
    partition test's NATS failure, 39 of 40)."""
    b = make(ack_wait="1")
    await b.open()
    m = msg()
    await b.enqueue([m])
    [first] = await b.fetch(["default"], 1, 0.2, 0, "w")
    if given_back == "rescue":
        await eventually(b.rescue, lambda r: int(r) == 1)  # its lease ran out
    [second] = await b.fetch(["default"], 1, 60.0, 10.0, "w")
    assert second.id == m.id and second.message is not None and second.message.attempt == 2
    if late == "ack":
        await b.ack([first])
    elif late == "retry":
        first.retry_at = time.time()
        await b.retry([first])
    else:
        assert await b.extend([first], 60.0) == [first]  # lost, as the heartbeat reports
    [st] = await b.stats()
    assert (st.running, st.succeeded) == (1, 0)  # the second claim is still listed
    await b.ack([second])
    info = await b.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and info.message.attempt == 2
    [st] = await b.stats()
    assert (st.running, st.succeeded, st.ready, st.retrying) == (0, 1, 0, 0)


async def test_a_finished_job_a_gone_process_still_lists_is_not_counted_as_running(
    make: Callable[..., NatsBroker],
) -> None:
    """A process died listing a job as running; JetStream delivered the job
    again after ``AckWait`` and another process ran it.  No worker runs to
    tidy the dead process' list, and ``stats`` must not count the job as
    running once the lease in that list has run out (it did, for ever)."""
    gone, other = make(ack_wait="1"), make(ack_wait="1")
    await gone.open()
    await other.open()
    m = msg()
    await gone.enqueue([m])
    await gone.fetch(["default"], 1, 0.5, 0, "w-gone")
    link = await gone._link()
    subject = gone.n.h + link.holder.id.encode()
    await eventually(
        lambda: link.store.read(gone.n.hold, subject),
        lambda cur: cur is not None and m.id in orjson.loads(cur.data)["run"],
    )
    await link.wire.close()  # "dies": its list says running, and stays so
    [d] = await other.fetch(["default"], 1, 30.0, 10.0, "w-other")
    await other.ack([d])
    assert (await other.get(m.id)).state is State.SUCCEEDED  # type: ignore[union-attr]
    await eventually(other.stats, lambda ss: [(s.succeeded, s.running) for s in ss] == [(1, 0)])


async def test_a_claim_that_failed_midway_does_not_leave_its_job_listed_as_running(
    make: Callable[..., NatsBroker],
) -> None:
    """A fetch lists its jobs as running before it claims them; here the claim
    fails (the jobs stream refuses the write; after a server restart it is
    JetStream's "503 no responders" until the streams are back).  JetStream
    delivers the job again and another process runs it.  The failed claim's
    entry used to stay in the first process' memory, written back with each
    list it wrote, and be left behind when it closed: ``stats`` showed the
    job running long after it succeeded.  Now that process' next rescue
    takes it out, and so does its close."""
    a, b = make(ack_wait="1"), make(ack_wait="1")
    await a.open()
    await b.open()
    m = msg()
    await a.enqueue([m])
    link = await a._link()
    path = f"STREAM.UPDATE.{a.n.jobs}"
    config = (await link.wire.api(f"STREAM.INFO.{a.n.jobs}"))["config"]
    await link.wire.api(path, {**config, "max_msg_size": 16})
    try:
        with pytest.raises(BrokerError):
            await a.fetch(["default"], 1, 60.0, 0, "w-a")
    finally:
        await link.wire.api(path, config)
    [d] = await b.fetch(["default"], 1, 30.0, 10.0, "w-b")  # after AckWait
    await b.ack([d])

    def counts(ss: list[QueueStats]) -> list[tuple[int, int]]:
        return [(s.succeeded, s.running) for s in ss]

    await a.rescue()
    await eventually(b.stats, lambda ss: counts(ss) == [(1, 0)], timeout=3.0)
    await a.close()
    assert counts(await b.stats()) == [(1, 0)]


async def test_a_pointer_dropped_as_stale_does_not_leave_its_job_listed_as_running(
    make: Callable[..., NatsBroker],
) -> None:
    """A second pointer of a job that has finished (JetStream delivering again
    a pointer whose ack was lost in a server restart; an id enqueued again
    after the de-duplication window) is listed by the fetch that claims it,
    then dropped.  The list used to keep it until the process wrote again:
    a worker idle from then on showed the job running, and left it so."""
    b = make()
    await b.open()
    m = msg()
    await b.enqueue([m])
    [d] = await b.fetch(["default"], 1, 60.0, 0, "w")
    await b.ack([d])
    link = await b._link()
    hdrs = ((b"Dw-Id", m.id), (b"Dw-G", "0"))
    await link.store.put(b.n.pointer("default", 0), encode(m), None, hdrs)
    assert await b.fetch(["default"], 1, 60.0, 0, "w") == []
    await eventually(
        b.stats, lambda ss: [(s.succeeded, s.running) for s in ss] == [(1, 0)], timeout=3.0
    )


async def test_a_job_whose_claim_was_stored_but_never_delivered_runs_again_at_once(
    make: Callable[..., NatsBroker],
) -> None:
    """A fetch claims a job (its record is written: running, 60 s lease), then
    fails before handing it over (here the next claim of the batch, a long
    undecodable body's, is refused by the jobs stream).  Nobody runs the job,
    and it used to wait for its lease to run out (and JetStream's AckWait)
    while ``stats`` counted it running.  The process' next rescue gives it
    back: it runs at once, without having spent an attempt."""
    a, b = make(), make()
    await a.open()
    await b.open()
    await a.declare(["default"])
    m = msg()
    await a.enqueue([m])
    link = await a._link()
    await link.store.put(
        a.n.pointer("default", 0), b"x" * 4096, None, ((b"Dw-Id", "raw-2"), (b"Dw-G", "0"))
    )
    path = f"STREAM.UPDATE.{a.n.jobs}"
    config = (await link.wire.api(f"STREAM.INFO.{a.n.jobs}"))["config"]
    await link.wire.api(path, {**config, "max_msg_size": 2048})
    try:
        with pytest.raises(BrokerError):
            await a.fetch(["default"], 2, 60.0, 0, "w-a")
        claimed = await a.get(m.id)
        assert claimed is not None and claimed.state is State.RUNNING  # stored, never delivered
    finally:
        await link.wire.api(path, config)
    await a.rescue()
    got = await b.fetch(["default"], 1, 30.0, 3.0, "w-b")
    assert [(d.id, d.message.attempt if d.message else None) for d in got] == [(m.id, 1)]
    await b.ack(got)
    await a.close()
    [st] = await b.stats()
    assert (st.succeeded, st.running) == (1, 0)


async def test_a_holder_list_jetstream_did_not_store_is_written_again(
    make: Callable[..., NatsBroker],
) -> None:
    """The list a settle writes is refused (here by the HOLD stream; after a
    server restart, by JetStream not being ready yet while the client is
    connected again).  It used to be a bare publish, lost without a word: the
    process, idle afterwards, left its job listed as running and uncounted.
    Now it is written again, with nothing else happening in that process."""
    b = make()
    await b.open()
    m = msg()
    await b.enqueue([m])
    [d] = await b.fetch(["default"], 1, 60.0, 0, "w")
    link = await b._link()
    path = f"STREAM.UPDATE.{b.n.hold}"
    config = (await link.wire.api(f"STREAM.INFO.{b.n.hold}"))["config"]
    await link.wire.api(path, {**config, "max_msg_size": 16})
    try:
        await b.ack([d])
        # a write to the same stream behind the list's: once it is refused,
        # so was the list (a stream stores what it is sent in order)
        with pytest.raises(JetStreamError):
            await link.store.put(b.n.h + b"probe", b"x" * 64)
    finally:
        await link.wire.api(path, config)
    assert (await b.get(m.id)).state is State.SUCCEEDED  # type: ignore[union-attr]
    await eventually(
        b.stats, lambda ss: [(s.succeeded, s.running) for s in ss] == [(1, 0)], timeout=3.0
    )


async def test_a_result_kept_longer_than_retention_outlives_the_record(
    make: Callable[..., NatsBroker],
) -> None:
    b = make(retention="1")
    await b.open()
    m = msg()
    await b.enqueue([m])
    [d] = await b.fetch(["default"], 1, 30.0, 0)
    d.result, d.result_ttl = b'{"value": 7}', 3600.0
    await b.ack([d])
    link = await b._link()

    async def record() -> Any:
        return await link.store.read(b.n.jobs, b.n.js + m.id.encode())

    await eventually(record, lambda r: r is None, timeout=15)  # JOBS max_age passed
    info = await b.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED and info.result == b'{"value": 7}'


async def test_an_undecodable_pointer_is_dead_lettered_with_its_body(
    make: Callable[..., NatsBroker],
) -> None:
    b = make()
    await b.open()
    await b.declare(["default"])
    link = await b._link()
    await link.store.put(
        b.n.pointer("default", 0), b"not json", None, ((b"Dw-Id", "bad-1"), (b"Dw-G", "0"))
    )
    [d] = await b.fetch(["default"], 1, 30.0, 0)
    assert d.id == "bad-1" and d.message is None and d.raw == b"not json"
    assert d.decode_error and "not a valid envelope" in d.decode_error
    await b.dead([d])
    [s] = [s for s in await b.stats() if s.queue == "default"]
    assert (s.dead, s.running, s.ready) == (1, 0, 0)
    [dead] = (await b.list_jobs(JobFilter(state=State.DEAD))).items
    assert dead.message.id == "bad-1"


#: bodies something else than dumbwaiter may put on a job subject
RAW_BODIES = [b"not json", b"\xff\xfe garbage \x00", b'{"foo": 1}', b"[1, 2]"]


async def test_raw_messages_on_a_job_subject_are_dead_letters_a_user_can_see_and_act_on(
    shared_url: str,
) -> None:
    """Raw bytes published straight to the work stream's subject (no headers,
    nothing of ours): each becomes a dead job, listed, counted, shown with its
    body and reason, replayable (it dies again the same way, its history kept,
    as on SQLite, Redis and PostgreSQL) and purgeable."""
    app = dw.App(shared_url)
    try:
        b = app.broker
        assert isinstance(b, NatsBroker)
        await b.declare(["default"])
        nc = await connect()
        try:
            js = nc.jetstream()
            for body in RAW_BODIES:
                await js.publish(b.n.pointer("default", 0).decode(), body)
        finally:
            await nc.close()
        assert (await drain(app, ["default"])).counts["dead"] == len(RAW_BODIES)

        listed = (await b.list_jobs(JobFilter(state=State.DEAD))).items
        assert sorted(i.raw or b"" for i in listed) == sorted(RAW_BODIES)
        [st] = await b.stats()
        assert (st.dead, st.ready, st.running) == (len(RAW_BODIES), 0, 0)
        by_body = {i.raw: i.message.id for i in listed if i.raw is not None}
        for body, jid in by_body.items():
            info = await b.get(jid)
            assert info is not None and info.state is State.DEAD and info.raw == body
            assert info.message.name == "?" and info.message.queue == "default"
            [err] = info.message.errors
            assert err.type == "dumbwaiter.errors.MessageDecodeError"
        bad_utf8 = await b.get(by_body[RAW_BODIES[1]])
        assert bad_utf8 is not None and "not valid UTF-8" in bad_utf8.message.errors[0].message
        shown = await asyncio.to_thread(
            CliRunner().invoke,
            cli_main,
            ["dlq", "show", by_body[b"not json"], "--json", "--url", shared_url],
        )
        assert shown.exit_code == 0, shown.output
        assert orjson.loads(shown.output)["raw"] == "not json"

        assert await b.replay(JobFilter(state=State.DEAD)) == len(RAW_BODIES)
        assert (await drain(app, ["default"])).counts["dead"] == len(RAW_BODIES)
        for body, jid in by_body.items():
            info = await b.get(jid)
            assert info is not None and info.state is State.DEAD and info.raw == body
            assert info.replays == 1 and len(info.message.errors) == 2

        assert await b.purge(JobFilter(state=State.DEAD)) == len(RAW_BODIES)
        assert [(s.dead, s.ready, s.running) for s in await b.stats()] == [(0, 0, 0)]
        assert (await b.list_jobs(JobFilter(state=State.DEAD))).items == []
        assert await b.get(by_body[b"not json"]) is None
    finally:
        await app.aclose()


async def test_a_long_raw_body_keeps_its_head_and_the_reason_says_so(
    make: Callable[..., NatsBroker],
) -> None:
    """A record holds the body base64 with its errors in one NATS message, so
    a body beyond three eighths of ``max_payload`` keeps its head only."""
    b = make()
    await b.open()
    await b.declare(["default"])
    link = await b._link()
    kept = link.wire.max_payload * 3 // 8
    body = b"\x00" * (kept + 1000)
    nc = await connect()
    try:
        await nc.jetstream().publish(b.n.pointer("default", 0).decode(), body)
    finally:
        await nc.close()
    [d] = await b.fetch(["default"], 1, 30.0, 0)
    assert d.message is None and d.raw == body
    assert d.decode_error and f"the first {kept} are kept" in d.decode_error
    d.error = ErrorRecord(time.time(), "dumbwaiter.errors.MessageDecodeError", d.decode_error)
    await b.dead([d])
    info = await b.get(d.id)
    assert info is not None and info.state is State.DEAD and info.raw == body[:kept]


async def test_dead_jobs_replayed_while_a_worker_waits_all_run(shared_url: str) -> None:
    """Issue 18 found RabbitMQ's replay publishing copies before rewriting the
    records, so a worker dropped copies whose record still said DEAD.  Here
    every move writes the record first and the copy names it (generation and
    sequence): 50 replayed while a worker long-polls all run."""
    app = dw.App(shared_url)
    ran: list[str] = []

    @app.task(name="t.replayed")
    async def replayed(n: int, ctx: dw.Context) -> None:
        ran.append(ctx.job_id)

    try:
        ids = {j.id for j in await replayed.aenqueue_many(range(50))}
        ds = await fetch_all(app.broker)
        for d in ds:
            d.error = ErrorRecord(time.time(), "builtins.ValueError", "boom")
        await app.broker.dead(ds)
        assert {d.id for d in ds} == ids
        worker = dw.Worker(app, concurrency=8)
        run = asyncio.create_task(worker.run())
        try:
            assert await app.broker.replay(JobFilter(state=State.DEAD)) == 50

            async def states() -> set[State]:
                return {i.state for j in ids if (i := await app.broker.get(j)) is not None}

            await eventually(states, lambda s: s == {State.SUCCEEDED}, timeout=30)
        finally:
            worker.stop()
            await run
        assert sorted(ran) == sorted(ids)
    finally:
        await app.aclose()


async def test_a_replayed_copy_is_not_dropped_on_a_record_read_older_than_it(
    make: Callable[..., NatsBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay writes the record first, then publishes the copy naming the
    record's sequence (``Dw-S``), so on one server a worker never reads an
    older record than its copy.  With ``replicas`` > 1 a direct get may be
    answered by a follower that has not applied the write yet: a claim that
    reads the record (an undecodable body's, or after a lost compare-and-set)
    judged the copy against the old record (DEAD, another generation) and
    dropped it as stale, and the replayed job never ran (RabbitMQ's replay
    hazard of issue 18).  Here one read is answered with the old record."""
    b = make()
    await b.open()
    await b.declare(["default"])
    link = await b._link()
    subject = b.n.js + b"raw-1"
    await link.store.put(
        b.n.pointer("default", 0), b"not json", None, ((b"Dw-Id", "raw-1"), (b"Dw-G", "0"))
    )
    [d] = await b.fetch(["default"], 1, 30.0, 0)
    d.error = ErrorRecord(time.time(), "dumbwaiter.errors.MessageDecodeError", "not json")
    await b.dead([d])
    old = [await link.store.read(b.n.jobs, subject)]
    assert await b.replay(JobFilter(state=State.DEAD)) == 1
    read = link.store.read

    async def behind(stream: str, subj: bytes) -> Any:
        return old.pop() if old and subj == subject else await read(stream, subj)

    monkeypatch.setattr(link.store, "read", behind)
    first = await b.fetch(["default"], 1, 30.0, 0)
    monkeypatch.undo()
    assert not old  # the claim read the record a replica behind would answer
    got = first or await b.fetch(["default"], 1, 30.0, 5.0)
    assert [x.id for x in got] == ["raw-1"]


async def test_a_job_scheduled_beyond_retention_stays_visible_and_keeps_its_key(
    make: Callable[..., NatsBroker],
) -> None:
    """Records live ``retention`` after their last write; the promoter holds a
    delay entry at most half of that and touches the job each time."""
    b = make(retention="2")
    await b.open()
    m = msg(eta=time.time() + 5, key="report:7")
    assert m.eta is not None
    await b.enqueue([m])
    fetching = asyncio.create_task(b.fetch(["default"], 1, 30.0, 15.0))
    while time.time() < m.eta - 0.5:  # twice the retention: the entry would be gone
        info = await b.get(m.id)
        assert info is not None and info.state is State.SCHEDULED
        assert await b.enqueue([msg(key="report:7")]) == [m.id]
        await asyncio.sleep(0.2)
    [d] = await asyncio.wait_for(fetching, 15)
    assert d.id == m.id


# -- kv_update: key locks and per-key compare-and-set ---------------------------------------


async def test_a_plain_write_between_an_updates_read_and_write_makes_it_decide_again(
    make: Callable[..., NatsBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's ``kv_set`` (which takes no lock) changes the second of
    two keys after the update read them: the update's write of that key
    fails, its write of the first is put back, and it decides again on the
    new value.  Its key locks are gone afterwards.  (A read then a plain
    write overwrote the other process's value with a stale decision.)"""
    b, other = make(), make()
    await b.open()
    await other.open()
    await b.kv_set({"pair:a": b"1", "pair:b": b"1"})
    link = await b._link()
    real = link.store.read_many
    ran: list[bool] = []

    async def read_then_write(stream: str, subjects: list[bytes]) -> Any:
        got = await real(stream, subjects)
        if not ran and b._kv_subject("pair:b") in subjects:
            ran.append(True)
            await other.kv_set({"pair:b": b"7"})
        return got

    monkeypatch.setattr(link.store, "read_many", read_then_write)
    seen: list[dict[str, bytes]] = []

    def decide(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        seen.append(dict(got))
        total = int(got["pair:a"]) + int(got["pair:b"])
        return {"pair:a": str(total).encode(), "pair:b": str(total).encode()}, total

    assert await b.kv_update(["pair:a", "pair:b"], decide) == 8
    assert seen == [{"pair:a": b"1", "pair:b": b"1"}, {"pair:a": b"1", "pair:b": b"7"}]
    assert await other.kv_get(["pair:a", "pair:b"]) == {"pair:a": b"8", "pair:b": b"8"}
    assert await link.store.subjects(b.n.kv, b.n.c + b"kvl.>") == {}


async def test_an_update_takes_over_the_key_locks_of_one_that_died(
    make: Callable[..., NatsBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed inside a ``kv_update`` leaves its key locks: the next
    update of those keys waits until they expire, then takes them over."""
    from dumbwaiter.brokers.nats import coordination as coord

    monkeypatch.setattr(coord, "KV_LOCK_TTL", 0.3)
    monkeypatch.setattr(coord, "KV_UPDATE_PATIENCE", 10.0)
    b = make()
    await b.open()
    link = await b._link()
    assert await b._kv_lock(link, ["job:1"])  # taken, never given back: its holder died
    assert await b._kv_lock(link, ["job:1"]) is None  # held

    def bump(got: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
        n = int(got.get("job:1", b"0")) + 1
        return {"job:1": str(n).encode()}, n

    assert await b.kv_update(["job:1"], bump) == 1
    assert await link.store.subjects(b.n.kv, b.n.c + b"kvl.>") == {}
