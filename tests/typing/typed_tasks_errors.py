"""Mistakes a type checker must catch in typed tasks.

Every line marked ``# E: code`` must get exactly those mypy error codes and
no other line any error (tests/unit/test_typing.py checks both).  Never run.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import dumbwaiter as dw

app = dw.App("memory://typing")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(keep_result=True)
async def mul(a: int, b: int = 2) -> int:
    return a * b


@app.task
def greet(name: str, *, loud: bool = False) -> str:
    return name


def sync_caller() -> None:
    add.enqueue("not an int", 2)  # E: arg-type
    add.enqueue(1)  # E: call-arg
    add.enqueue(1, 2, 3)  # E: call-arg
    add.enqueue(a=1, c=2)  # E: call-arg
    greet.enqueue("ada", True)  # E: call-arg
    mul.enqueue("x")  # E: call-overload
    add.options(delay=1).enqueue(1, "2")  # E: arg-type
    add("x", 2)  # E: arg-type
    add.si(1)  # E: call-arg
    wrong: str = add.enqueue(1, 2).result()  # E: assignment
    also_wrong: str = mul.enqueue(1).result()  # E: assignment
    jobs: list[dw.Job[str]] = add.enqueue_many([(1, 2)])  # E: assignment
    print(wrong, also_wrong, jobs)
    with sqlite3.connect("shop.db") as conn:
        app.outbox(conn).enqueue(add, "not an int", 2)  # E: call-overload
        app.outbox(conn).enqueue(add, 1)  # E: call-overload
        app.outbox(conn).enqueue(mul, "x")  # E: call-overload
        in_outbox: str = app.outbox(conn).enqueue(add, 1, 2).result()  # E: assignment
        print(in_outbox)


async def async_caller() -> None:
    await add.aenqueue("x", 2)  # E: arg-type
    await mul.aenqueue(b=3)  # E: call-overload
    wrong: str = (await mul.aenqueue(1)).result()  # E: assignment
    not_awaited: int = mul(1)  # E: assignment
    print(wrong, not_awaited)
    conn: Any = object()
    await app.outbox(conn).aenqueue(add, "x", 2)  # E: call-overload


@app.task(queu="email")  # E: call-overload, untyped-decorator
def misspelt_option() -> None: ...


@app.task(retry=3)  # E: call-overload, untyped-decorator
def wrong_option_type() -> None: ...


@app.task(priority="high")  # E: call-overload, untyped-decorator
def wrong_priority() -> None: ...


@app.workflow
def flow(ctx: dw.WorkflowContext, user_id: int) -> str:
    return str(user_id)


flow.enqueue("42")  # E: arg-type
flow.enqueue(42, 43)  # E: call-arg
flow_result: int = flow.enqueue(42).result()  # E: assignment


@app.workflow(versoin=2)  # E: call-overload, untyped-decorator
def misspelt_workflow_option(ctx: dw.WorkflowContext) -> None: ...
