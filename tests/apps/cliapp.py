"""The app ``tests/unit/test_cli.py`` points the CLI at: ``tests.apps.cliapp:create_app``.

It is a factory, not a module-level App, because the CLI imports this module
once per test process while every test has its own database: the factory
builds a fresh App on each call, on the URL in ``$CLIAPP_URL``.
"""

from __future__ import annotations

import os

import dumbwaiter as dw

URL_ENV = "CLIAPP_URL"


def add(a: int, b: int) -> int:
    return a + b


def fail(n: int) -> None:
    raise ValueError(f"boom {n}")


def notify(user_id: int, *, channel: str = "mail") -> None:
    """A task on its own queue, to check that queue and kwargs travel."""


def create_app() -> dw.App:
    app = dw.App(os.environ[URL_ENV])
    app.task(keep_result=True)(add)
    app.task(retry=dw.Retry.never())(fail)
    app.task(queue="email")(notify)
    return app
