"""``Message.copy``: what in-memory brokers (memory, the RabbitMQ ledger)
hand to the worker, which appends errors and bumps attempts on its own."""

from __future__ import annotations

import dataclasses
import time

from dumbwaiter.message import ErrorRecord, Message, uuid7


def test_a_copy_equals_its_message_and_shares_no_container() -> None:
    m = Message(
        id=uuid7(),
        kind="task",
        name="t",
        queue="q",
        args=[1, [2]],
        kwargs={"a": 1},
        payload={"p": 1},
        headers={"h": "1"},
        attempt=2,
        max_attempts=5,
        created_at=time.time(),
        eta=time.time() + 5,
        priority=3,
        key="k",
        errors=[ErrorRecord(time=1.0, type="E", message="m")],
    )
    defaults = Message(id="x", kind="x", name="x", queue="x")
    for f in dataclasses.fields(Message):  # every field is set here: a new one must be too
        assert getattr(m, f.name) != getattr(defaults, f.name), f.name
    c = m.copy()
    assert c == m
    for name in ("args", "kwargs", "headers", "errors"):
        assert getattr(c, name) is not getattr(m, name), name
    c.errors.append(ErrorRecord(time=2.0, type="F", message="n"))
    c.attempt += 1
    assert len(m.errors) == 1 and m.attempt == 2
