"""The durable workflows of the dashboard's workflow-run tests and screenshot.

``create_app(url)`` builds a fresh App each call (the dashboard and the
worker each get their own, as two processes would).  ``ship`` fails until
the file ``$DASHWF_FLAG`` exists, so a test can fix the "outage" and retry
the run from the page.
"""

from __future__ import annotations

import os
from typing import Any

import dumbwaiter as dw


class OrderConfirmed(dw.Event, type="dashboard_wf.order_confirmed", version=1):
    order_id: str
    by: str = "customer"


def charge_card(order_id: str, cents: int) -> dict[str, Any]:
    return {"id": f"ch-{order_id}", "cents": cents, "currency": "EUR"}


def reserve(order_id: str) -> list[str]:
    return [f"{order_id}/sku-1", f"{order_id}/sku-2"]


def ship(order_id: str) -> str:
    flag = os.environ.get("DASHWF_FLAG", "")
    if not flag or not os.path.exists(flag):
        raise ConnectionError(f"carrier down: no pickup for {order_id}")
    return f"parcel-{order_id}"


def create_app(url: str) -> dw.App:
    app = dw.App(url, retry=dw.Retry.never())

    @app.workflow(name="shop.order")
    def order(ctx: dw.WorkflowContext, order_id: str, cents: int) -> dict[str, Any]:
        charge = ctx.step("charge", charge_card, order_id, cents)
        items = ctx.step("reserve", reserve, order_id)
        parcel = ctx.step("ship", ship, order_id)
        return {"charge": charge["id"], "items": len(items), "parcel": parcel}

    @app.workflow(name="shop.fulfil")
    def fulfil(ctx: dw.WorkflowContext, order_id: str) -> str:
        ctx.step("pack", lambda: f"box for {order_id}")
        ctx.sleep("cool-off", 3600)
        return ctx.step("hand-over", lambda: f"handed over {order_id}")

    @app.workflow(name="shop.confirm")
    def confirm(ctx: dw.WorkflowContext, order_id: str) -> str:
        ctx.step("ask", lambda: f"asked about {order_id}")
        event = ctx.wait_for_event(
            "confirmation", OrderConfirmed, match={"order_id": order_id}, timeout=86400
        )
        return f"confirmed by {event.by}" if event is not None else "expired"

    @app.workflow(name="shop.label")
    def label(ctx: dw.WorkflowContext, order_id: str) -> str:
        return ctx.child("fulfilment", fulfil, order_id)

    @app.workflow(name="shop.noop")
    def noop(ctx: dw.WorkflowContext, n: int) -> int:
        return n

    return app
