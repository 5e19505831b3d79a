"""Flow control through the App and real workers: limits, unique, debounce."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

import dumbwaiter as dw
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.brokers import require_capability


@pytest.fixture
def app(make_app: Callable[..., dw.App], broker_name: str) -> dw.App:
    a = make_app(retry=dw.Retry.never())
    require_capability(broker_name, a.broker.capabilities, "limits")
    return a


async def test_concurrency_per_key_is_never_exceeded_and_costs_no_attempts(app: dw.App) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    # a tenant's first job holds its slot until a second one runs beside it
    # (or 5 s pass: a limit of 1 would then show as a peak of 1), so the
    # peak of 2 is reached on a slow state store too
    full = {"a": asyncio.Event(), "b": asyncio.Event()}

    @app.task(concurrency=2, limit_key=lambda a: a["tenant"])
    async def report(tenant: str, n: int) -> None:
        running[tenant] = running.get(tenant, 0) + 1
        peak[tenant] = max(peak.get(tenant, 0), running[tenant])
        if running[tenant] == 2:
            full[tenant].set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(full[tenant].wait(), 5)
        await asyncio.sleep(0.02)
        running[tenant] -= 1

    await report.aenqueue_many([("a", i) for i in range(8)] + [("b", i) for i in range(4)])
    w = await drain(app, concurrency=16)
    assert peak == {"a": 2, "b": 2}
    assert w.counts["succeeded"] == 12 and w.counts["dead"] == 0  # one attempt each, none lost
    assert w.counts["throttled"] > 0


async def test_rate_limit_holds_in_every_window_of_start_times(app: dw.App) -> None:
    starts: list[float] = []

    @app.task(rate_limit="10/0.5s")
    async def call_api(n: int, ctx: dw.Context) -> None:
        starts.append(ctx.started_at)

    await call_api.aenqueue_many(range(25))
    await drain(app, concurrency=8)
    starts.sort()
    assert len(starts) == 25
    for i, t in enumerate(starts):  # any window of 0.5 s holds at most 10 starts
        assert sum(1 for u in starts[i:] if u < t + 0.5) <= 10


async def test_unique_while_queued_or_running(app: dw.App) -> None:
    release = asyncio.Event()
    started = asyncio.Event()
    finished = asyncio.Event()

    @app.task(unique=True)
    async def rebuild(index: str) -> None:
        started.set()
        await release.wait()
        finished.set()

    first = await rebuild.aenqueue("products")
    assert (await rebuild.aenqueue("products")).id == first.id  # queued
    assert (await rebuild.aenqueue("orders")).id != first.id  # other arguments
    worker = dw.Worker(app, concurrency=4)
    run = asyncio.create_task(worker.run())
    await started.wait()
    assert (await rebuild.aenqueue("products")).id == first.id  # running
    release.set()
    await finished.wait()
    worker.stop()
    await run  # settles the outcome before it returns
    assert await first.astatus() == State.SUCCEEDED
    again = await rebuild.aenqueue("products")
    assert again.id != first.id  # finished: a new job may run


async def test_unique_within_a_window(app: dw.App) -> None:
    @app.task(unique=timedelta(seconds=30))
    def digest(user_id: int) -> None: ...

    a = await digest.aenqueue(1)
    await drain(app)
    assert (await digest.aenqueue(1)).id == a.id  # finished, but still inside the window
    assert (await digest.aenqueue(2)).id != a.id


async def test_debounce_runs_a_burst_once_after_it(app: dw.App) -> None:
    runs: list[float] = []

    @app.task(debounce=0.3)
    async def reindex(doc: str) -> None:
        runs.append(time.time())

    jobs = []
    for _ in range(5):
        await asyncio.sleep(0.05)  # a burst of edits
        jobs.append(await reindex.aenqueue("doc-1"))
    last = time.time()  # the burst's last enqueue
    assert len({j.id for j in jobs}) == 1
    await drain(app)
    assert len(runs) == 1 and runs[0] > last  # once, after the burst ended


def test_flow_options_are_checked_at_declaration() -> None:
    app = dw.App("memory://")
    with pytest.raises(dw.ConfigurationError, match="N/UNIT"):
        app.task(rate_limit="fast")(lambda: None)
    with pytest.raises(dw.ConfigurationError, match="concurrency must be"):
        app.task(concurrency=0, name="c")(lambda: None)
    with pytest.raises(dw.ConfigurationError, match="needs rate_limit or concurrency"):
        app.task(limit_key=lambda a: 1, name="k")(lambda: None)
    with pytest.raises(dw.ConfigurationError, match="not both"):
        app.task(unique=True, debounce=1, name="u")(lambda: None)
