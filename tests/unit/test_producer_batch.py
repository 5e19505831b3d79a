"""Bulk enqueue's cheaper producer path: batch ids and batch-built envelopes.

``Task.messages`` builds the envelopes of ``enqueue_many`` with batch-wide
values worked out once and ids from ``uuid7_many``; these tests pin that it
makes the same envelopes, byte for byte, as ``Task.message`` does one call at a
time, and that batch ids keep ``uuid7``'s guarantees.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any

import pytest

import dumbwaiter as dw
import dumbwaiter.message as message_mod
from dumbwaiter.context import Context, reset_current, set_current
from dumbwaiter.message import (
    TASK,
    Message,
    decode,
    encode,
    encode_checked,
    encode_checked_text,
    uuid7,
    uuid7_many,
)
from dumbwaiter.task import SendOptions

# -- ids ---------------------------------------------------------------------------


def _check_v7(s: str) -> uuid.UUID:
    u = uuid.UUID(s)
    assert str(u) == s  # canonical, lowercase, dashed
    assert u.version == 7 and u.variant == uuid.RFC_4122
    return u


def _ms_seq(s: str) -> tuple[int, int]:
    """An id's milliseconds and counter."""
    v = _check_v7(s).int
    return v >> 80, (v >> 64) & 0xFFF


def test_uuid7_many_are_valid_v7_increasing_and_interleave_with_uuid7() -> None:
    ids = [uuid7(), *uuid7_many(5000), uuid7(), *uuid7_many(1), *uuid7_many(3), uuid7()]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    before = time.time_ns() // 1_000_000
    for s in ids[:3] + ids[-3:]:
        ms = _check_v7(s).int >> 80
        assert abs(ms - before) < 60_000  # the clock's milliseconds
    assert uuid7_many(0) == [] and uuid7_many(-1) == []


def test_uuid7_many_carries_the_counter_into_the_next_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    future = time.time_ns() // 1_000_000 + 1000  # a clock that went back: keep counting
    monkeypatch.setattr(message_mod, "_last_ms", future)
    monkeypatch.setattr(message_mod, "_seq", 0xFFD)
    ids = uuid7_many(5)
    assert [_ms_seq(s) for s in ids] == [
        (future, 0xFFE),
        (future, 0xFFF),
        (future + 1, 0),
        (future + 1, 1),
        (future + 1, 2),
    ]
    nxt = uuid7()
    assert nxt > ids[-1] and _ms_seq(nxt) == (future + 1, 3)
    # a batch longer than one millisecond's counter spans several milliseconds
    big = uuid7_many(10_000)
    assert big == sorted(big) and len(set(big)) == 10_000 and big[0] > nxt


def test_uuid7_many_unique_and_increasing_across_threads() -> None:
    per_thread: list[list[str]] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def make() -> None:
        start.wait()
        mine: list[str] = []
        for i in range(200):
            mine.extend(uuid7_many(1 + i % 37) if i % 3 else [uuid7()])
        with lock:
            per_thread.append(mine)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [s for mine in per_thread for s in mine]
    assert len(set(every)) == len(every)
    for mine in per_thread:  # each caller sees its ids strictly increasing
        assert all(a < b for a, b in itertools.pairwise(mine))


# -- envelopes ---------------------------------------------------------------------


def _without_id(m: Message) -> bytes:
    m2 = decode(encode(m))
    m2.id = "ID"
    return encode(m2)


@pytest.fixture
def app() -> dw.App:
    return dw.App("memory://")  # never opened: only the producer side runs


def test_envelope_bytes_of_a_bulk_job_are_unchanged(app: dw.App) -> None:
    @app.task(name="noop", queue="q", priority=3)
    async def noop(i: int) -> None: ...

    (m,) = noop.messages([7], SendOptions())
    m.id, m.created_at = "0190a6b2-0000-7000-8000-000000000000", 1700000000.5
    assert (
        encode(m)
        == encode_checked(m, 1 << 20)
        == (
            b'{"id":"0190a6b2-0000-7000-8000-000000000000","kind":"task","name":"noop",'
            b'"queue":"q","args":[7],"kwargs":{},"headers":{},"attempt":0,"max_attempts":4,'
            b'"created_at":1700000000.5,"eta":null,"priority":3,"key":null,"errors":[]}'
        )
    )
    assert decode(encode(m)) == m


@pytest.mark.parametrize("size", [0, 300, 511, 2000])
def test_encode_checked_copies_keep_the_same_bytes(app: dw.App, size: int) -> None:
    # small envelopes are copied out of orjson's result (a batch holds them):
    # the same bytes, as bytes and as text, on either side of the copy limit
    @app.task(name="noop")
    async def noop(s: str) -> None: ...

    (m,) = noop.messages(["x" * size], SendOptions())
    raw = encode(m)
    assert encode_checked(m, 1 << 20) == raw
    assert type(encode_checked(m, 1 << 20)) is bytes
    assert encode_checked_text(m, 1 << 20) == raw.decode()
    with pytest.raises(dw.PayloadTooLarge):
        encode_checked(m, len(raw) - 1)
    with pytest.raises(dw.PayloadTooLarge):
        encode_checked_text(m, len(raw) - 1)


CALLS: list[Any] = [1, "x", None, True, 2**64 - 1, -(2**63), 1.5, [1, 2], {"a": 1}, (3,), (4, 5)]


@pytest.mark.parametrize(
    "opts",
    [
        SendOptions(),
        SendOptions.make(delay=5, priority=9, key="k", queue="other", headers={"h": 1}),
        SendOptions.make(eta=1e10),
    ],
)
def test_messages_build_what_message_builds(app: dw.App, opts: SendOptions) -> None:
    @app.task(name="t")
    def t(a: Any, b: Any = None) -> None: ...

    calls: list[Any] = [*CALLS, {"a": 1, "b": 2}]
    many = list(t.messages(calls, opts))
    one = []
    for c in calls:
        args, kwargs = (c, {}) if type(c) is tuple else (((), c) if type(c) is dict else ((c,), {}))
        one.append(t.message(args, kwargs, opts, many[0].created_at))
    assert [_without_id(m) for m in many] == [_without_id(m) for m in one]
    ids = [m.id for m in many]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_messages_give_each_job_its_own_headers_and_args(app: dw.App) -> None:
    @app.task(name="t")
    def t(a: Any) -> None: ...

    opts = SendOptions.make(headers={"h": 1})
    a, b = t.messages([1, 2], opts)
    a.headers["x"] = 1
    a.args.append(9)
    assert b.headers == {"h": 1} and opts.headers == {"h": 1} and b.args == [2]

    c, d = t.messages(range(2), SendOptions())
    c.headers["x"] = 1
    assert d.headers == {}


def test_messages_check_every_argument_before_yielding_it(app: dw.App) -> None:
    @app.task(name="one")
    def one(a: Any) -> None: ...

    @app.task(name="two")
    def two(a: int, b: int) -> None: ...

    @app.task(name="star")
    def star(*a: Any) -> None: ...

    for bad, err in [(2**64, "64 bits"), (float("nan"), "nan"), ({1, 2}, "set")]:
        with pytest.raises(dw.SerializationError, match=err):
            list(one.messages([1, bad], SendOptions()))
    with pytest.raises(dw.InvalidArguments, match="missing a required argument"):
        list(two.messages([1], SendOptions()))
    assert [m.args for m in star.messages([1, (2, 3)], SendOptions())] == [[1], [2, 3]]
    with pytest.raises(dw.SerializationError):
        list(star.messages([object()], SendOptions()))


def test_messages_inherit_the_running_jobs_cause(app: dw.App) -> None:
    @app.task(name="t")
    def t(a: Any) -> None: ...

    parent = Message(id=uuid7(), kind=TASK, name="p", queue="q", headers={"correlation_id": "c"})
    token = set_current(Context(parent, app, "w"))
    try:
        msgs = list(t.messages(range(3), SendOptions()))
    finally:
        reset_current(token)
    assert all(m.headers == {"correlation_id": "c", "causation_id": parent.id} for m in msgs)
    msgs[0].headers["x"] = 1
    assert "x" not in msgs[1].headers


def test_messages_of_a_flow_controlled_task_get_their_own_stamps(app: dw.App) -> None:
    @app.task(name="t", limit_key=lambda a: a["a"] % 2, rate_limit="10/s")
    def t(a: int) -> None: ...

    msgs = list(t.messages(range(3), SendOptions()))
    assert [m.headers["limit_key"] for m in msgs] == ["0", "1", "0"]
