"""Bounded queues from the producer's side: ``max_ready`` on a task or the
App, ``dw.QueueFull`` at the call, ``when_full="wait"`` up to the deadline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.brokers.capacity import waiting


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dw.App]:
    a = dw.App(f"sqlite:///{tmp_path}/jobs.db", max_ready={"mail": 2})
    yield a
    a.close()


def _waiting(app: dw.App, queue: str) -> int:
    rows = app._call(app.broker.stats())
    return sum(waiting(r) for r in rows if r.queue == queue)


def test_an_enqueue_past_the_bound_raises_at_the_producer(app: dw.App) -> None:
    @app.task(queue="mail")
    def send(n: int) -> None: ...

    @app.task(queue="reports")
    def report(n: int) -> None: ...

    send.enqueue(1)
    send.enqueue(2)
    with pytest.raises(dw.QueueFull, match=r"queue 'mail' is full.*max_ready=2") as raised:
        send.enqueue(3)
    assert isinstance(raised.value, dw.BrokerError)
    with pytest.raises(dw.QueueFull):
        send.enqueue_many([(4,), (5,)])
    with pytest.raises(dw.QueueFull):
        app._call(send.aenqueue(6))
    assert _waiting(app, "mail") == 2  # nothing of a refused call was stored
    report.enqueue_many([(i,) for i in range(5)])  # another queue is not bounded
    assert _waiting(app, "reports") == 5


def test_a_task_bounds_its_queue(tmp_path: Path) -> None:
    app = dw.App(f"sqlite:///{tmp_path}/jobs.db")
    try:

        @app.task(queue="push", max_ready=1)
        def push(n: int) -> None: ...

        push.enqueue(1)
        with pytest.raises(dw.QueueFull, match="max_ready=1"):
            push.options(delay=60).enqueue(2)  # scheduled jobs wait too
    finally:
        app.close()


def test_a_bound_that_cannot_work_is_refused_where_it_is_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.db"
    with pytest.raises(dw.ConfigurationError, match="positive integer"):
        dw.App(url, max_ready={"q": 0})
    with pytest.raises(dw.ConfigurationError, match="when_full"):
        dw.App(url, max_ready={"q": 3}, when_full="drop")  # type: ignore[arg-type]
    app = dw.App(url, max_ready={"q": 3})
    with pytest.raises(dw.ConfigurationError, match="bounded twice"):

        @app.task(queue="q", max_ready=4)
        def other(n: int) -> None: ...

    with pytest.raises(dw.ConfigurationError, match="needs max_ready"):

        @app.task(queue="q", when_full="wait")
        def third(n: int) -> None: ...


@contextmanager
def _one_slot_mail(
    tmp_path: Path, enqueue_timeout: float
) -> Iterator[tuple[dw.App, dw.Task[[int], None]]]:
    """An App whose queue ``mail`` holds one waiting job, producers waiting
    for room up to ``enqueue_timeout``; and its task, with the one job in."""
    app = dw.App(
        f"sqlite:///{tmp_path}/jobs.db",
        max_ready={"mail": 1},
        when_full="wait",
        enqueue_timeout=enqueue_timeout,
    )
    try:

        @app.task(queue="mail")
        def send(n: int) -> None: ...

        send.enqueue(1)
        yield app, send
    finally:
        app.close()


def test_when_full_wait_enqueues_once_a_worker_makes_room(tmp_path: Path) -> None:
    with _one_slot_mail(tmp_path, 60) as (app, send):
        done: list[dw.Job[None]] = []
        producer = threading.Thread(target=lambda: done.append(send.enqueue(2)))
        producer.start()
        consumer = dw.App(app.url)
        try:
            got = consumer._call(consumer.broker.fetch(["mail"], 1, lease=30, wait=5))
            assert len(got) == 1 and got[0].message is not None
            assert got[0].message.args == [1]
            producer.join(60)
            assert done and _waiting(consumer, "mail") == 1
        finally:
            consumer.close()


def test_when_full_wait_raises_at_the_deadline(tmp_path: Path) -> None:
    with _one_slot_mail(tmp_path, 0.3) as (app, send):
        with pytest.raises(dw.QueueFull):
            send.enqueue(2)
        with pytest.raises(dw.QueueFull):
            asyncio.run(send.aenqueue(3))
        assert _waiting(app, "mail") == 1


def test_max_ready_holds_for_eager_and_middleware_paths(tmp_path: Path) -> None:
    seen: list[str] = []

    class Count(dw.Middleware):
        def after_enqueue(self, message: dw.Message, id: str) -> None:
            seen.append(id)

    app = dw.App(f"sqlite:///{tmp_path}/jobs.db", max_ready={"mail": 1}, middleware=[Count()])
    try:

        @app.task(queue="mail")
        def send(n: int) -> None: ...

        send.enqueue(1)
        with pytest.raises(dw.QueueFull):
            send.enqueue(2)
        assert len(seen) == 1  # after_enqueue ran for the admitted job only
    finally:
        app.close()
