"""The RabbitMQ producer's own encodings and waits, without a server: a new
job's record built around its envelope's bytes is the record ``Record.dump``
writes, and a confirm that never comes ends as a ``TimeoutError`` while a
caller's cancellation stays one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import orjson
import pytest

from dumbwaiter.brokers.rabbitmq import link as link_mod
from dumbwaiter.brokers.rabbitmq.link import AmqpLink
from dumbwaiter.brokers.record import Record, new_record
from dumbwaiter.message import TASK, Message, encode_checked
from dumbwaiter.state import State


def _message(**fields: Any) -> Message:
    base: dict[str, Any] = {
        "id": "0190f6c2-7a1b-7000-8000-00000000abcd",
        "kind": TASK,
        "name": "noop",
        "queue": "default",
        "args": [1],
        "kwargs": {},
        "headers": {},
        "attempt": 0,
        "max_attempts": 3,
        "created_at": 1_765_000_000.123456,
    }
    return Message(**(base | fields))


@pytest.mark.parametrize(
    "msg",
    [
        _message(),
        _message(args=["ünïcode", {"a": [1.5, None, True]}], kwargs={"k": "v" * 300}),
        _message(eta=1_765_000_100.5, priority=2, key="k1", headers={"trace": "x"}),
    ],
)
@pytest.mark.parametrize("state", [State.READY, State.SCHEDULED])
def test_a_new_records_bytes_are_record_dumps(msg: Message, state: State) -> None:
    raw = encode_checked(msg, None)
    rec = Record(msg=msg, state=state, run_at=1_765_000_000.5, updated_at=1_765_000_000.25)
    rec.enq = "0123456789abcdef"
    built = new_record(raw, state, rec.run_at, rec.updated_at, "0123456789abcdef")
    assert built == rec.dump()
    assert Record.load(built) == Record.load(rec.dump())
    assert orjson.loads(built)["m"] == msg.to_dict()


class _Channel:
    """What ``outgoing.confirmed`` uses of aiormq's channel; ``waiting`` is
    set once a confirm's wait has begun."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()

    @asynccontextmanager
    async def _raise_on_channel_close(self) -> AsyncIterator[None]:
        self.waiting.set()
        yield


async def test_a_confirm_that_never_comes_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_mod, "CONFIRM_TIMEOUT", 0.01)
    confirmation: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    link = object.__new__(AmqpLink)
    with pytest.raises(TimeoutError):
        await link.confirm_one((cast(Any, _Channel()), confirmation))
    assert confirmation.cancelled()  # aiormq drops it when its ack comes late


async def test_a_cancelled_caller_is_cancelled_not_timed_out() -> None:
    confirmation: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    link = object.__new__(AmqpLink)
    ch = _Channel()
    waiting = asyncio.ensure_future(link.confirm_one((cast(Any, ch), confirmation)))
    await ch.waiting.wait()  # waiting for the confirmation now
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()


async def test_an_ack_ends_the_wait() -> None:
    from pamqp import commands as spec

    confirmation: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    link = object.__new__(AmqpLink)
    ch = _Channel()
    waiting = asyncio.ensure_future(link.confirm_one((cast(Any, ch), confirmation)))
    await ch.waiting.wait()  # waiting for the confirmation now
    confirmation.set_result(spec.Basic.Ack(delivery_tag=1))
    await waiting  # returns: the copy was confirmed
    assert waiting.exception() is None
