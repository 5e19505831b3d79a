"""The app the event CLI tests point at: ``tests.apps.eventsapp:app``.

A fresh App on ``$EVENTSAPP_URL`` at each lookup, like ``cliapp``; the
event classes are module-level, as in real code, with types of their own so
they never clash with other tests' classes.
"""

from __future__ import annotations

import os
from typing import Any

import dumbwaiter as dw

URL_ENV = "EVENTSAPP_URL"
HANDLED: list[str] = []


class SignupCompleted(dw.Event, type="account.signup_completed", version=2):
    user_id: int
    plan: str = "free"


class SignupCompletedV1(dw.Event, type="account.signup_completed", version=1):
    user_id: int


class InvoicePaid(dw.Event, type="billing.invoice_paid"):
    invoice_id: str
    cents: int


def welcome(event: SignupCompleted) -> None:
    HANDLED.append(f"welcome:{event.user_id}")


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "plan": "free"}


def create_app() -> dw.App:
    app = dw.App(os.environ[URL_ENV])
    app.subscribe(SignupCompleted, group="email")(welcome)
    app.upcast("account.signup_completed", from_version=1)(v1_to_v2)
    return app


def __getattr__(name: str) -> dw.App:
    """``tests.apps.eventsapp:app``: a fresh App from ``create_app`` at each lookup.

    The CLI calls nothing it finds behind ``--app``, so the per-test App
    comes from this module's own attribute lookup instead.
    """
    if name == "app":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
