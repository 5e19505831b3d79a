"""The one-at-a-time producer paths: ``enqueue``/``aenqueue`` straight to the
broker when no flow control and no enqueue hook is in the way, the portal's
thread hop for brokers without a sync producer, and ``uuid7``'s cached
millisecond text.  These pin that the short cuts keep every behaviour of the
general path."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.context import Context, reset_current, set_current
from dumbwaiter.message import uuid7, uuid7_many
from dumbwaiter.portal import Portal


def _async_only(app: dw.App) -> None:
    """Make ``app``'s memory broker look like NATS/RabbitMQ: no sync producer."""
    b = app.broker
    b.capabilities = dataclasses.replace(b.capabilities, sync_enqueue=False)  # type: ignore[misc]


def _app(*, sync: bool = True) -> tuple[dw.App, Any]:
    app = dw.App("memory://")

    @app.task(name="t.add", priority=3, queue="q1")
    def add(a: int, b: int = 0) -> int:
        return a + b

    if not sync:
        _async_only(app)
    return app, add


def _stored(app: dw.App, job: dw.Job) -> dw.Message:
    info = job.info()
    assert info is not None
    return info.message


@pytest.mark.parametrize("sync", [True, False])
def test_sync_enqueue_stores_the_full_envelope(sync: bool) -> None:
    app, add = _app(sync=sync)
    try:
        job = add.enqueue(1, b=2)
        m = _stored(app, job)
        assert (m.name, m.queue, m.priority, m.args, m.kwargs) == ("t.add", "q1", 3, [1], {"b": 2})
        assert m.headers == {} and m.eta is None and m.key is None and m.id == job.id
        bound = add.options(priority=7, queue="q2", headers={"h": 1}).enqueue(4)
        m = _stored(app, bound)
        assert (m.queue, m.priority, m.headers) == ("q2", 7, {"h": 1})
    finally:
        app.close()


async def test_aenqueue_stores_the_envelope_and_inherits_the_cause() -> None:
    app, add = _app()
    job = await add.aenqueue(5)
    info = await job.ainfo()
    assert info is not None and info.message.args == [5] and info.message.headers == {}
    parent = add.message((0,), {}, dw.task.SendOptions())
    parent.headers["correlation_id"] = "corr-1"
    token = set_current(Context(parent, app, "w"))
    try:
        child = await add.aenqueue(6)
    finally:
        reset_current(token)
    info = await child.ainfo()
    assert info is not None
    assert info.message.headers == {"correlation_id": "corr-1", "causation_id": parent.id}


def test_bad_arguments_still_fail_at_the_call() -> None:
    _, add = _app()
    with pytest.raises(dw.InvalidArguments):
        add.enqueue()
    with pytest.raises(dw.SerializationError):
        add.enqueue({1, 2})


class _Hooks(dw.Middleware):
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def before_enqueue(self, message: dw.Message) -> None:
        message.headers["stamped"] = True
        self.seen.append("before")

    def after_enqueue(self, message: dw.Message, id: str) -> None:
        self.seen.append(f"after {id == message.id}")


@pytest.mark.parametrize("sync", [True, False])
def test_a_middleware_added_later_runs_on_single_enqueues(sync: bool) -> None:
    """``app.use`` after the tasks were registered: the short cut must see it."""
    app, add = _app(sync=sync)
    try:
        add.enqueue(1)  # before: the short cut
        seen: list[str] = []
        app.use(_Hooks(seen))
        job = add.enqueue(2)
        assert seen == ["before", "after True"]
        assert _stored(app, job).headers == {"stamped": True}
        ajob = app._call(add.aenqueue(3))
        assert seen[2:] == ["before", "after True"]
        assert _stored(app, ajob).headers == {"stamped": True}
    finally:
        app.close()


def test_portal_returns_results_and_raises_errors_from_the_loop_thread() -> None:
    portal = Portal()
    try:

        async def where() -> str:
            await asyncio.sleep(0)
            return threading.current_thread().name

        async def fails() -> None:
            raise KeyError("boom")

        assert portal.call(where()) == "dumbwaiter-portal"
        with pytest.raises(KeyError, match="boom"):
            portal.call(fails())
        # many callers at once, from many threads: each gets its own result
        results: dict[int, int] = {}

        async def echo(i: int) -> int:
            await asyncio.sleep(0)
            return i

        def caller(k: int) -> None:
            for i in range(50):
                results[k * 1000 + i] = portal.call(echo(k * 1000 + i))

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {k: k for k in results} and len(results) == 400
    finally:
        portal.close()


def test_portal_call_from_its_own_thread_is_refused() -> None:
    portal = Portal()
    try:

        async def inner() -> None:
            coro = asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="deadlock"):
                portal.call(coro)

        portal.call(inner())
    finally:
        portal.close()


def test_uuid7_cached_millisecond_text_stays_right_across_uuid7_many() -> None:
    """``uuid7`` caches its millisecond's text; ``uuid7_many`` moves the clock
    state on (into later milliseconds when its counter runs out), and the
    ids after it must still carry their own millisecond and keep increasing."""
    ids: list[str] = []
    for _ in range(20):
        ids.append(uuid7())
        ids.extend(uuid7_many(9000))  # more than two milliseconds of counter
        ids.append(uuid7())
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for s in ids[::997]:
        u = uuid.UUID(s)
        assert u.version == 7 and u.variant == uuid.RFC_4122 and str(u) == s
