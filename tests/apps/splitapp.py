"""The app of ``tests/integration/rabbitmq/test_split.py``'s worker processes:
``tests.apps.splitapp:app``, on the broker URL in ``$DUMBWAITER_URL`` (the
test names no ``state=``, as the user in issue 20 did)."""

from __future__ import annotations

import dumbwaiter as dw

app = dw.App()


@app.task
def noop() -> None:
    """Nothing: the test only needs workers that start (or refuse to)."""
