"""Django ``@task`` functions (module level, as Django's Tasks framework requires)."""

from __future__ import annotations

from django.db import connection
from django_tasks import TaskContext, task


@task(queue_name="email")
def send_receipt(order_id: str) -> str:
    """Writes through the worker thread's own Django connection."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO shop_receipts (order_id) VALUES (%s)", [order_id])
    return f"receipt for {order_id}"


@task(priority=10)
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def which_attempt(context: TaskContext, label: str) -> dict[str, object]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
async def shout(word: str) -> str:
    return word.upper()


@task
def boom(why: str) -> None:
    raise ValueError(why)
