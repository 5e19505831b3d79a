"""Batch jobs on every broker: sharding, progress, callbacks once, resume, checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.testing import drain


@pytest.fixture
def app(make_app: Callable[..., dw.App]) -> dw.App:
    return make_app(retry=dw.Retry.never())


async def test_a_lazy_iterable_is_sharded_and_callbacks_run_once(app: dw.App) -> None:
    seen: list[list[int]] = []
    summaries: list[dict[str, Any]] = []
    pulled = {"n": 0}

    def orders() -> Iterator[int]:  # a generator: never all in memory
        for i in range(1050):
            pulled["n"] += 1
            yield i

    @app.task
    def settle(items: list[int]) -> None:
        seen.append(items)

    @app.task
    def report(summary: dict[str, Any], label: str) -> None:
        summaries.append({**summary, "label": label})

    b = await app.abatch(settle, orders(), chunk_size=100, on_complete=report.s("nightly"))
    await drain(app)
    assert sorted(x for chunk in seen for x in chunk) == list(range(1050))
    assert sorted(len(c) for c in seen) == [50] + [100] * 10
    p = await b.aprogress()
    assert (p["total"], p["done"], p["failed"], p["items"], p["state"]) == (
        11,
        11,
        0,
        1050,
        "complete",
    )
    assert [(s["label"], s["done"], s["total"]) for s in summaries] == [("nightly", 11, 11)]


async def test_a_key_range_travels_as_bounds(app: dw.App) -> None:
    got: list[tuple[int, int]] = []

    @app.task
    def settle_range(start: int, stop: int) -> None:
        got.append((start, stop))

    await app.abatch(settle_range, range(0, 1_000_000), chunk_size=250_000)
    await drain(app)
    assert sorted(got) == [
        (0, 250_000),
        (250_000, 500_000),
        (500_000, 750_000),
        (750_000, 1_000_000),
    ]


async def test_resume_after_partial_failure(app: dw.App) -> None:
    broken = {"on": True}
    runs: list[int] = []
    outcomes: list[str] = []

    @app.task
    def settle(items: list[int]) -> None:
        runs.append(items[0])
        if broken["on"] and items[0] in (20, 40):
            raise RuntimeError(f"bad row in shard starting at {items[0]}")

    @app.task
    def done(summary: dict[str, Any]) -> None:
        outcomes.append("complete")

    @app.task
    def failed(summary: dict[str, Any]) -> None:
        outcomes.append(f"failed {summary['failed']}")

    items = list(range(60))
    b = await app.abatch(settle, items, chunk_size=10, on_complete=done.s(), on_failure=failed.s())
    await drain(app)
    p = await b.aprogress()
    assert (p["done"], p["failed"], p["state"]) == (4, 2, "failed")
    assert outcomes == ["failed 2"]
    assert sorted(runs) == [0, 10, 20, 30, 40, 50]

    broken["on"] = False
    again = await app.abatch(settle, items, chunk_size=10, on_complete=done.s(), batch_id=b.id)
    await drain(app)
    assert sorted(runs) == [0, 10, 20, 20, 30, 40, 40, 50]  # only the two failed shards again
    p = await again.aprogress()
    assert (p["done"], p["failed"], p["state"]) == (6, 0, "complete")
    assert outcomes == ["failed 2", "complete"]  # each callback once


async def test_a_retried_shard_continues_from_its_checkpoint(app: dw.App) -> None:
    processed: list[int] = []

    @app.task(retry=dw.Retry(attempts=3, backoff=0.01, jitter=0))
    async def settle(items: list[int], ctx: dw.Context) -> None:
        start = await ctx.aload_checkpoint() or 0
        for n, item in enumerate(items[start:], start):
            if ctx.attempt == 1 and n == 6:
                raise ConnectionError("lost the database halfway")
            processed.append(item)
            await ctx.acheckpoint(n + 1)

    @app.task(retry=dw.Retry(attempts=3, backoff=0.01, jitter=0))
    def settle_sync(items: list[int], ctx: dw.Context) -> None:
        start = ctx.load_checkpoint() or 0
        for n, item in enumerate(items[start:], start):
            if ctx.attempt == 1 and n == 3:
                raise ConnectionError("lost the database halfway")
            processed.append(item)
            ctx.checkpoint(n + 1)

    await app.abatch(settle, list(range(100, 110)), chunk_size=10)
    await app.abatch(settle_sync, [200, 201, 202, 203, 204], chunk_size=5)
    await drain(app)
    assert sorted(processed) == [*range(100, 110), 200, 201, 202, 203, 204]  # each once
