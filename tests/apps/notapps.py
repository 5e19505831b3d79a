"""What ``--app`` must not be pointed at: ``tests/unit/test_cli.py`` checks
that the CLI names each (a function, a Task, a class) and calls none of them.

``CALLED`` records every call, so a test sees that no user code ran.
"""

from __future__ import annotations

import dumbwaiter as dw

CALLED: list[str] = []

app = dw.App("memory://notapps")


def wipe_cache() -> dw.App:
    """A function with a side effect (returning an App would not make it a factory)."""
    CALLED.append("wipe_cache")
    return app


@app.task
def send_welcome(user_id: int) -> None:
    CALLED.append("send_welcome")


class Settings:
    def __init__(self) -> None:
        CALLED.append("Settings")
