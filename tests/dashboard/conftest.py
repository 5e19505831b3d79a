"""Fixtures of the dashboard tests: a seeded SQLite broker, a TestClient that
talks from loopback, and a helper that finds the page's CSRF token."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from starlette.testclient import TestClient

from dumbwaiter.dashboard import create_app
from dumbwaiter.testing import drain
from tests.dashboard.dashapp import OrderPaid
from tests.dashboard.dashapp import create_app as create_dashapp

LOOPBACK = ("127.0.0.1", 51000)
T = TypeVar("T")


@dataclass
class Seeded:
    url: str
    flag: Path
    dead: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    scheduled: str = ""
    keyed: str = ""


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Seeded:
    """mail: 3 ready, 1 scheduled, 2 dead; reports: 1 ready (key r:1);
    group:ledger: 1 ready event delivery."""
    url = f"sqlite:///{tmp_path}/dash.db"
    flag = tmp_path / "smtp-up"
    monkeypatch.setenv("DASHAPP_URL", url)
    monkeypatch.setenv("DASHAPP_FLAG", str(flag))
    s = Seeded(url, flag)

    async def seed() -> None:
        app = create_dashapp()
        flaky, welcome, report = (
            app.tasks[n] for n in ("dashapp.flaky", "dashapp.welcome", "dashapp.report")
        )
        s.dead = [(await flaky.aenqueue(f"u{i}@example.com")).id for i in range(2)]
        await drain(app, ["mail"])
        s.ready = [(await welcome.aenqueue(i)).id for i in range(3)]
        s.scheduled = (await welcome.options(delay=3600).aenqueue(99)).id
        s.keyed = (await report.options(key="r:1").aenqueue("weekly")).id
        await app.apublish(OrderPaid(order="o-1"))
        await app.aclose()

    in_thread(seed)
    return s


def in_thread(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(fn())`` on a thread of its own: the browser tests' thread
    runs Playwright's event loop, where ``asyncio.run`` cannot."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(fn()))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


@pytest.fixture
def client(seeded: Seeded) -> Iterator[TestClient]:
    star = create_app(create_dashapp(), sample=False)
    with TestClient(star, client=LOOPBACK) as c:
        yield c


def csrf(page_html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', page_html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def ids_on(page_html: str) -> list[str]:
    return re.findall(r'<tr data-id="([^"]+)"', page_html)


def cell(page_html: str, queue: str, col: str) -> str:
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page_html, re.S)
    assert row, f"no row for {queue}"
    m = re.search(rf'data-col="{col}">(?:<a [^>]*>)?([^<]*)', row.group(1))
    assert m, f"no {col} cell for {queue}"
    return m.group(1).strip()
