"""The app ``tests/unit/test_cli.py`` points the CLI at: ``tests.apps.cliapp:app``.

Not a module-level App made at import, because the CLI imports this module
once per test process while every test has its own database: each lookup of
``app`` (the module's ``__getattr__``) builds a fresh App on the URL in
``$CLIAPP_URL``, and tests build their own with ``create_app``.
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


def report() -> None:
    """Two tasks end in ``report`` (this and ``billing.report``): a short name
    that is ambiguous."""


def billing_report() -> None: ...


def create_app() -> dw.App:
    app = dw.App(os.environ[URL_ENV])
    app.task(keep_result=True)(add)
    app.task(retry=dw.Retry.never())(fail)
    app.task(queue="email")(notify)
    app.task(report)
    app.task(name="billing.report")(billing_report)
    return app


def __getattr__(name: str) -> dw.App:
    """``tests.apps.cliapp:app``: a fresh App from ``create_app`` at each lookup.

    The CLI calls nothing it finds behind ``--app``, so the per-test App
    comes from this module's own attribute lookup instead.
    """
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
