"""A sync enqueue or publish under a running event loop warns, naming the
``await`` form; the same call where no loop runs (a script, a worker's
thread, a sync view's thread) stays silent.

The project's pytest configuration turns warnings into errors, so every
test here that expects silence fails if the call warns."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dumbwaiter as dw
from dumbwaiter.blocking import BlockingCallWarning
from dumbwaiter.testing import drain


class Paid(dw.Event, type="blocking.order.paid", version=1):
    order: str


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dw.App]:
    a = dw.App(f"sqlite:///{tmp_path}/jobs.db")
    yield a
    a.close()


async def test_a_sync_enqueue_in_async_code_warns_at_the_call_site(app: dw.App) -> None:
    @app.task
    def send_mail(order: str) -> None: ...

    with pytest.warns(BlockingCallWarning) as caught:
        job = send_mail.enqueue("o-1")
    [w] = caught.list
    assert w.filename == __file__  # the user's line, not dumbwaiter's
    assert "send_mail.enqueue() blocks the running event loop" in str(w.message)
    assert "await send_mail.aenqueue(...)" in str(w.message)
    assert isinstance(w.message, RuntimeWarning)
    assert await job.astatus() == "ready"  # it still works: a warning, not an error


async def test_every_sync_producer_call_warns(app: dw.App) -> None:
    @app.task
    def send_mail(order: str) -> None: ...

    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: send_mail.options(priority=1).enqueue("o-2"), "aenqueue"),
        (lambda: send_mail.enqueue_many(["o-3", "o-4"]), "aenqueue_many"),
        (lambda: send_mail.options(delay=5).enqueue_many(["o-5"]), "aenqueue_many"),
        (lambda: app.publish(Paid(order="o-6")), "apublish"),
    ]
    for call, name in calls:
        with pytest.warns(BlockingCallWarning, match=f"await .*{name}") as caught:
            call()
        assert [w.filename for w in caught.list] == [__file__]
    [stats] = [s for s in await app.broker.stats() if s.queue == "default"]
    assert (stats.ready, stats.scheduled) == (3, 1)  # each call did its work


async def test_one_warning_per_call_site(app: dw.App) -> None:
    @app.task
    def send_mail(order: str) -> None: ...

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default for a RuntimeWarning
        for i in range(3):
            send_mail.enqueue(f"o-{i}")
        send_mail.enqueue("o-3")  # another line: warned again
    assert [w.category for w in caught] == [BlockingCallWarning, BlockingCallWarning]


async def test_the_async_forms_and_a_thread_without_a_loop_are_silent(app: dw.App) -> None:
    @app.task
    def send_mail(order: str) -> None: ...

    await send_mail.aenqueue("o-1")
    await send_mail.aenqueue_many(["o-2"])
    await app.apublish(Paid(order="o-3"))
    # a sync endpoint of an ASGI framework runs in a thread: no loop there
    await asyncio.to_thread(send_mail.enqueue, "o-4")
    await asyncio.to_thread(app.publish, Paid(order="o-5"))


def test_a_sync_caller_with_no_loop_is_silent(app: dw.App) -> None:
    @app.task
    def send_mail(order: str) -> None: ...

    send_mail.enqueue("o-1")
    send_mail.enqueue_many(["o-2"])
    app.publish(Paid(order="o-3"))


async def test_a_sync_task_enqueuing_from_the_worker_thread_pool_is_silent(app: dw.App) -> None:
    """Sync handlers run in the worker's threads, so their sync enqueue does
    not block the worker's loop: no warning (here it would fail the job)."""
    done: list[str] = []

    @app.task
    def receipt(order: str) -> None:
        done.append(order)

    @app.task(retry=False)
    def place(order: str) -> None:
        receipt.enqueue(order)

    await place.aenqueue("o-1")
    worker = await drain(app)
    assert done == ["o-1"] and worker.counts.get("dead", 0) == 0
