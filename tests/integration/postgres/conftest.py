"""Fixtures of the PostgreSQL engine tests: a fresh schema per test, dropped after it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from dumbwaiter.brokers.postgres import PostgresBroker
from tests.integration.postgres import server


@pytest.fixture
def schema() -> Iterator[str]:
    name = server.new_schema()
    yield name
    server.drop([name])


@pytest.fixture
def make_url(schema: str) -> Callable[..., str]:
    """``make_url(**options)``: a URL on this test's schema (``?migrate=auto`` by default)."""

    def make(**options: Any) -> str:
        return server.url(schema, **{k: str(v) for k, v in options.items()})

    return make


@pytest.fixture
async def make_broker(make_url: Callable[..., str]) -> AsyncIterator[Callable[..., PostgresBroker]]:
    made: list[PostgresBroker] = []

    def make(**options: Any) -> PostgresBroker:
        b = PostgresBroker(make_url(**options))
        made.append(b)
        return b

    yield make
    for b in made:
        await b.close()
