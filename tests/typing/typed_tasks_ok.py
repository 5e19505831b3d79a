"""Typed tasks as a user writes them: this file must pass ``mypy --strict``.

Never run, only type-checked by tests/unit/test_typing.py; ``assert_type``
fails the check when a type is not exactly the one written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, assert_type

import dumbwaiter as dw

app = dw.App("memory://typing")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="math", retry=dw.Retry(attempts=2), timeout=5, keep_result=True)
async def mul(a: int, b: int = 2) -> int:
    return a * b


@app.task(rate_limit="10/s", limit_key=lambda args: args["name"], unique=timedelta(minutes=1))
def greet(name: str, *, loud: bool = False) -> str:
    return name.upper() if loud else name


@app.task
def send(user_id: int, ctx: dw.Context) -> None:
    ctx.logger.info("sending to %s", user_id)


@app.task(name="ctx_first")
async def first(ctx: dw.Context, user_id: int) -> list[str]:
    return [ctx.job_id, str(user_id)]


@app.task
def loose(payload: Any, extra: dict[str, Any]) -> int:
    return len(payload) + len(extra)


#: a middleware's own task options: the checker does not know them, so they
#: travel in a dict of Any (``Middleware.task_options``)
middleware_options: dict[str, Any] = {"tenant_quota": 5}


@app.task(queue="quota", **middleware_options)
def with_middleware_option(n: int) -> None: ...


@app.periodic(every=timedelta(minutes=5))
def tick() -> int:
    return 0


nightly = app.periodic(cron="0 3 * * *", args=(1, 2), name="nightly-add")(add)


def sync_caller() -> None:
    job = add.enqueue(1, 2)
    assert_type(job, dw.Job[int])
    assert_type(job.result(timeout=1), int)
    assert_type(add.enqueue(a=1, b=2), dw.Job[int])
    assert_type(mul.enqueue(3), dw.Job[int])
    assert_type(mul.enqueue(3, b=4).result(), int)
    assert_type(greet.enqueue("ada", loud=True).result(), str)
    assert_type(add.options(delay=5, priority=1).enqueue(1, 2), dw.Job[int])
    assert_type(mul.options(key="k").enqueue(1), dw.Job[int])
    assert_type(add.enqueue_many([(1, 2), {"a": 3, "b": 4}]), list[dw.Job[int]])
    assert_type(mul.enqueue_many([1, 2]), list[dw.Job[int]])
    assert_type(add.options(queue="q").enqueue_many([(1, 2)]), list[dw.Job[int]])
    # calling a task runs the function here: its own signature and return type
    assert_type(add(1, 2), int)
    coro = assert_type(mul(3), Coroutine[Any, Any, int])
    coro.close()
    # a task taking a Context keeps its return type; its arguments are not checked
    assert_type(send.enqueue(42), dw.Job[None])
    assert_type(first.enqueue(42).result(), list[str])
    assert_type(with_middleware_option.enqueue(1), dw.Job[None])
    loose.enqueue({"a": 1}, {})  # an Any parameter: accepted (mypy makes it Task[Any, Any])
    assert_type(add.si(1, 2), dw.workflow.Signature)
    assert_type(tick.enqueue().result(), int)
    assert_type(nightly.enqueue(1, 2), dw.Job[int])
    # the generic classes spelt out, and bare (any task, any result) as before
    typed: dw.Task[[int, int], int] = add
    anything: dw.Task = mul
    handle: dw.Job = add.enqueue(1, 2)
    assert_type(handle.result(), Any)
    assert_type(typed, dw.Task[[int, int], int])
    assert_type(anything, dw.Task[..., Any])
    assert_type(app.job("0190a0f0-0000-7000-8000-000000000000"), dw.Job[Any])
    # the outbox's enqueue is typed as the task's
    with sqlite3.connect("shop.db") as conn:
        assert_type(app.outbox(conn).enqueue(add, 1, 2), dw.Job[int])
        assert_type(app.outbox(conn).enqueue(mul, 3), dw.Job[int])
        assert_type(app.outbox(conn).enqueue(greet, "ada", loud=True), dw.Job[str])
        assert_type(app.outbox(conn).enqueue(send, 42), dw.Job[None])


async def async_caller() -> None:
    assert_type(await add.aenqueue(1, 2), dw.Job[int])
    assert_type(await mul.aenqueue(1), dw.Job[int])
    assert_type(await (await mul.aenqueue(1)).aresult(timeout=1), int)
    assert_type(await mul(1, 2), int)
    assert_type(await add.options(priority=1).aenqueue(1, 2), dw.Job[int])
    assert_type(await add.aenqueue_many([(1, 2)]), list[dw.Job[int]])
    assert_type(await mul.options(delay=1).aenqueue_many([1]), list[dw.Job[int]])
    assert_type(await first.aenqueue(7), dw.Job[list[str]])
    conn: Any = object()  # an async connection (psycopg, SQLAlchemy)
    assert_type(await app.outbox(conn).aenqueue(add, 1, 2), dw.Job[int])
    assert_type(await app.outbox(conn).aenqueue(mul, 1, b=2), dw.Job[int])


# -- durable workflows (@app.workflow) ------------------------------------------


@app.workflow
def signup(ctx: dw.WorkflowContext, user_id: int, email: str) -> str:
    charged = ctx.step("charge", add, 1, 2)
    assert_type(charged, int)
    ctx.sleep("nap", 5)
    assert_type(ctx.child("child", onboard, user_id), bool)
    return email


@app.workflow(version=2, queue="flows", retry=dw.Retry(attempts=2))
async def onboard(ctx: dw.AsyncWorkflowContext, user_id: int) -> bool:
    await ctx.sleep("wait", timedelta(days=3))
    assert_type(await ctx.uuid(), str)
    return ctx.version > 1


def start_workflows() -> None:
    typed_flow: dw.DurableWorkflow[[int, str], str] = signup
    run = signup.enqueue(42, "a@example.com")
    assert_type(run, dw.WorkflowRun[str])
    assert_type(run.result(timeout=5), str)
    assert_type(run.status(), str)
    print(typed_flow)
    assert_type(onboard.enqueue(1), dw.WorkflowRun[bool])
    assert_type(onboard.options(key="onboard:1").enqueue(1), dw.WorkflowRun[bool])


async def astart_workflows() -> None:
    run = await onboard.aenqueue(1)
    assert_type(await run.aresult(), bool)
