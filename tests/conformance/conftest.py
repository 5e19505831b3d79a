"""The ``broker`` fixture, parametrized over every broker.

Each test gets a fresh namespace (a private memory store, a new SQLite file),
so tests never see each other's jobs.  ``make_broker`` makes more brokers on
the same namespace: two of them behave like two processes sharing the engine.
A broker joins the suite by adding one entry to ``tests/brokers.py``; each
test runs on every row of ``BROKERS`` (the brokers, and RabbitMQ on each
state store).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.message import TASK, Message, uuid7
from tests.brokers import BROKERS


@pytest.fixture(params=sorted(BROKERS))
def broker_name(request: pytest.FixtureRequest) -> str:
    """The test's broker: its name in ``tests/brokers.py`` (``BROKERS``)."""
    return str(request.param)


@pytest.fixture
def broker_url(broker_name: str, tmp_path: Path) -> str:
    """A fresh namespace on one broker; every ``make_broker()`` shares it."""
    return BROKERS[broker_name](tmp_path)


@pytest.fixture
async def make_broker(broker_url: str) -> AsyncIterator[Callable[[], Broker]]:
    made: list[Broker] = []

    def make() -> Broker:
        b = from_url(broker_url)
        made.append(b)
        return b

    yield make
    for b in made:
        await b.close()


@pytest.fixture
async def broker(make_broker: Callable[[], Broker]) -> Broker:
    b = make_broker()
    await b.open()
    return b


def msg(
    name: str = "t.job",
    queue: str = "default",
    *,
    args: list[Any] | None = None,
    **kw: Any,
) -> Message:
    """A task message as a producer would make it."""
    kw.setdefault("max_attempts", 4)
    return Message(
        id=uuid7(),
        kind=TASK,
        name=name,
        queue=queue,
        args=args if args is not None else [],
        created_at=time.time(),
        **kw,
    )


@pytest.fixture
async def make_app(broker_url: str) -> AsyncIterator[Callable[..., dw.App]]:
    """Apps on the test's broker namespace, closed after the test."""
    made: list[dw.App] = []

    def make(**kw: Any) -> dw.App:
        a = dw.App(broker_url, **kw)
        made.append(a)
        return a

    yield make
    for a in made:
        await a.aclose()
