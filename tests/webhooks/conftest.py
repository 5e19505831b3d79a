"""Fixtures of the webhook tests: a real receiver, and apps whose deliveries
may reach it (loopback is allowed explicitly, as nothing else would be)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from tests.brokers import BROKERS

from .receiver import Receiver, serve

FAST = dw.Retry(attempts=3, backoff=0.05, jitter=0)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    r = Receiver()
    with serve(r) as url:
        yield r, url


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return BROKERS[request.param](tmp_path)


@pytest.fixture
async def make_app(broker_url: str) -> AsyncIterator[Callable[..., dw.App]]:
    """Apps on the test's broker, webhooks allowed to loopback, fast retries."""
    made: list[dw.App] = []

    def make(**settings: Any) -> dw.App:
        app = dw.App(broker_url)
        settings.setdefault("allow_private", True)
        settings.setdefault("retry", FAST)
        settings.setdefault("timeout", 0.5)
        app.webhooks.configure(**settings)
        made.append(app)
        return app

    yield make
    for a in made:
        await a.aclose()


@pytest.fixture
async def app(make_app: Callable[..., dw.App]) -> dw.App:
    return make_app()
