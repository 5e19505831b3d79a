"""Django's Tasks framework on dumbwaiter: enqueue in a transaction, run, read the result.

    python main.py

Runs the example project on throwaway SQLite files: a POST /orders whose
transaction commits, one that rolls back, then `manage.py dumbwaiter_worker
--drain` (the outbox relay and a worker, until nothing is left), then the
results through Django's TaskResult API.  In production, run
`python manage.py dumbwaiter_worker` beside the web server instead.
"""

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ["SHOP_DATA"] = tempfile.mkdtemp()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from shop.tasks import send_receipt, total

    with connection.cursor() as cur:
        cur.execute("CREATE TABLE shop_orders (id TEXT PRIMARY KEY)")
    client = Client()
    ok = client.post(
        "/orders",
        {"id": "o-1", "email": "ann@example.com", "lines": [1200, 99]},
        content_type="application/json",
    ).json()
    failed = client.post(
        "/orders",
        {"id": "o-2", "email": "bob@example.com", "lines": [5], "declined": True},
        content_type="application/json",
    )
    print("committed order:", sorted(ok), "| rolled back order:", failed.status_code)
    call_command("dumbwaiter_worker", "--drain", "--log-level", "WARNING")
    print(send_receipt.get_result(ok["receipt"]).return_value)
    result = total.get_result(ok["total"])
    print("total:", result.status, result.return_value)


if __name__ == "__main__":
    main()
