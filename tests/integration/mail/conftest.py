"""Fixtures of the mail tests: an app on a real (SQLite) broker, a real SMTP
server on a loopback port, and a mailer sending to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.mail import SMTP, Mailer
from tests.mail.smtpsink import Sink, smtp_server

#: fast retries: the schedule is the mailer's to choose, the tests check the outcome
FAST = dw.Retry(attempts=3, backoff=0.05, jitter=0)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dw.App]:
    a = dw.App(f"sqlite:///{tmp_path}/mail.db")
    yield a
    a.close()


@pytest.fixture
def sink() -> Iterator[tuple[Sink, int]]:
    s = Sink()
    with smtp_server(s) as port:
        yield s, port


@pytest.fixture
def mailer(app: dw.App, sink: tuple[Sink, int]) -> Mailer:
    return Mailer(
        app, SMTP("127.0.0.1", sink[1], timeout=10), sender="Shop <shop@example.com>", retry=FAST
    )
