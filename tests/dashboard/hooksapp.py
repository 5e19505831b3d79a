"""Webhook endpoints in every state the endpoints page shows, made for real:
deliveries to a uvicorn receiver on loopback (tests/webhooks/receiver.py),
run by a worker, on a SQLite broker.

* ``ep_ok`` (/ok): one delivery, delivered;
* ``ep_flaky`` (/flaky/1): one delivery, dead (500, and no retries); a replay
  gets it through (the receiver answers 200 to a webhook-id's second try);
* ``ep_gone`` (/gone): one delivery, answered 410 Gone: the endpoint is
  disabled and the delivery dead;
* ``ep_down`` (/fail): two deliveries, both 500 and dead, and two failures
  in a row open its circuit breaker.
"""

from __future__ import annotations

from dataclasses import dataclass

import dumbwaiter as dw
from dumbwaiter.testing import drain

ENDPOINTS = {"ep_ok": "/ok", "ep_flaky": "/flaky/1", "ep_gone": "/gone", "ep_down": "/fail"}


def create_app(url: str) -> dw.App:
    """The app of the seeding code, the worker and the dashboard: loopback is
    allowed (the receiver is there), one attempt per delivery, and a breaker
    that opens after two failures and stays open for an hour."""
    app = dw.App(url)
    app.webhooks.configure(
        allow_private=True,
        retry=dw.Retry.never(),
        timeout=5,
        breaker_threshold=2,
        breaker_cooldown=3600,
    )
    return app


@dataclass(frozen=True)
class Hooks:
    url: str
    receiver: str
    #: endpoint id -> the webhook-ids sent to it
    sent: dict[str, list[str]]


async def seed(url: str, receiver: str) -> Hooks:
    app = create_app(url)
    sent: dict[str, list[str]] = {}
    for ep_id, path in ENDPOINTS.items():
        ep = await app.webhooks.aadd_endpoint(
            receiver + path, id=ep_id, description=f"the partner {ep_id[3:]}"
        )
        n = 2 if ep_id == "ep_down" else 1
        sent[ep_id] = [
            (await app.webhooks.asend(ep, "dashhooks.paid", {"n": i})).webhook_id for i in range(n)
        ]
    await deliver(app)
    return Hooks(url, receiver, sent)


async def deliver(app: dw.App) -> None:
    """Run the deliveries waiting now (one at a time: the breaker's count is
    exact), then close the app (its pooled connections to the receiver too)."""
    try:
        await drain(app, concurrency=1)
    finally:
        await app.aclose()
