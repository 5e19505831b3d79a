"""Durable workflows: what needs no broker of its own (memory://)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import dumbwaiter as dw
from dumbwaiter.durable import WorkflowNotFound, store
from dumbwaiter.durable.replay import Replay
from dumbwaiter.testing import drain


async def test_a_worker_shutdown_stops_a_sync_workflow_thread_before_its_next_step() -> None:
    app = dw.App("memory://durable-shutdown")
    started, gate, exited = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> str:
        started.set()
        gate.wait(10)
        ran.append("block")
        return "b"

    @app.workflow
    def flow(ctx: dw.WorkflowContext) -> str:
        try:
            ctx.step("block", block)
            ctx.step("after", lambda: ran.append("after"))
            return "ok"
        finally:
            exited.set()

    run = await flow.aenqueue()
    worker = dw.Worker(app, dw.WorkerConfig(fetch_wait=0.1))
    task = asyncio.create_task(worker.run())
    assert await asyncio.to_thread(started.wait, 10)
    worker.stop(immediate=True)  # the run's job goes back, its thread runs on
    await task
    gate.set()
    assert await asyncio.to_thread(exited.wait, 10)
    assert ran == ["block"]  # the thread took no further step once its job was given back
    exited.clear()
    await drain(app)
    assert await run.aresult(timeout=5) == "ok"
    assert ran == ["block", "block", "after"]  # the step it was in ran again; the next once


async def test_two_replays_recording_one_step_keep_the_first_result() -> None:
    app = dw.App("memory://durable-race")

    @app.workflow
    def flow(ctx: dw.WorkflowContext) -> None:
        return None

    rec = store.new_record("r-1", flow.name, 1, [], {}, "j-1", "default", None)
    await app.broker.kv_set({store.run_key("r-1"): store.dumps(rec)})
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        a, b = (Replay(app, flow, rec, "j-1", virgin=True, pool=pool, loop=loop) for _ in "ab")
        first = await a.record(0, {"n": "charge", "k": "step", "v": "ch-A"})
        second = await b.record(0, {"n": "charge", "k": "step", "v": "ch-B"})
    assert first["v"] == second["v"] == "ch-A"


def test_workflow_options_and_signatures_are_checked_at_registration() -> None:
    app = dw.App("memory://durable-options")
    with pytest.raises(dw.ConfigurationError, match="unknown workflow option"):
        app.workflow(timeout=3)(lambda ctx: None)  # type: ignore[call-overload]
    with pytest.raises(dw.ConfigurationError, match="version must be an integer"):
        app.workflow(version=0)(lambda ctx: None)
    with pytest.raises(dw.ConfigurationError, match="context first"):

        def bare() -> None:
            return None

        app.workflow(bare)  # type: ignore[arg-type]


async def test_step_names_must_be_unique_in_a_run() -> None:
    app = dw.App("memory://durable-names", retry=dw.Retry.never())

    @app.workflow
    def flow(ctx: dw.WorkflowContext) -> None:
        for _ in range(2):
            ctx.step("mail", lambda: None)

    run = await flow.aenqueue()
    await drain(app)
    with pytest.raises(dw.WorkflowFailed, match="'mail' is used twice"):
        await run.aresult(timeout=1)


async def test_a_run_whose_record_expired_is_not_reported_pending() -> None:
    app = dw.App("memory://durable-pruned")

    @app.workflow
    def flow(ctx: dw.WorkflowContext) -> int:
        return 1

    run = await flow.aenqueue()
    assert await run.astatus() == "pending"
    await drain(app)
    assert await run.aresult(timeout=1) == 1
    await app.broker.kv_delete([store.run_key(run.id)])  # its retention ran out
    with pytest.raises(WorkflowNotFound):
        await run.astatus()
    with pytest.raises(WorkflowNotFound):
        await run.aresult(timeout=1)
