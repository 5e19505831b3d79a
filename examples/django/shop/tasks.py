"""Django tasks: plain Django Tasks API; dumbwaiter runs them."""

from django_tasks import task  # Django 6: from django.tasks import task


@task(queue_name="email")
def send_receipt(order_id: str, email: str) -> str:
    return f"receipt for {order_id} mailed to {email}"


@task
def total(order_id: str, lines: list[int]) -> int:
    return sum(lines)
