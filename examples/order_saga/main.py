"""An order saga: charge, reserve stock, ship; undo in reverse when a step fails.

    python examples/order_saga/main.py

Each step with ``compensate=`` registers how to undo it.  When a later step
fails for good (its retries used up), the completed steps' compensations run,
last first, each checkpointed like a step, and the run fails: it lands in
the dead-letter queue with the reason, and `dumbwaiter workflows show RUN`
shows the timeline.  Runs on a throwaway SQLite file with an in-process
worker; in production `dumbwaiter worker` runs the steps.
"""

import asyncio
import tempfile

import dumbwaiter as dw
from dumbwaiter.testing import drain

app = dw.App(f"sqlite:///{tempfile.mkdtemp()}/orders.db")

QUICK = dw.Retry(attempts=2, backoff=0.1, jitter=0)  # the demo's; the default waits 5 s, 30 s...


class CarrierRejected(Exception):
    pass


def charge(order_id: str, cents: int) -> dict:
    print(f"  charge {cents} for {order_id}")
    return {"charge": f"ch-{order_id}", "cents": cents}


def refund(charged: dict) -> None:
    print(f"  refund {charged['charge']} ({charged['cents']})")


def reserve(order_id: str, items: list[str]) -> dict:
    print(f"  reserve {items} for {order_id}")
    return {"reservation": f"r-{order_id}", "items": items}


def release(reserved: dict) -> None:
    print(f"  release {reserved['reservation']}")


def ship(order_id: str, address: str) -> str:
    if "Atlantis" in address:
        raise CarrierRejected(f"no carrier delivers to {address}")
    print(f"  ship {order_id} to {address}")
    return f"parcel-{order_id}"


@app.workflow(retry=QUICK)
def order(
    ctx: dw.WorkflowContext, order_id: str, cents: int, items: list[str], address: str
) -> str:
    ctx.step("charge", charge, order_id, cents, compensate=refund)
    ctx.step("reserve", reserve, order_id, items, compensate=release)
    return ctx.step("ship", ship, order_id, address)


async def main() -> None:
    good = await order.aenqueue("o-1", 1649, ["mug"], "1 Main St")
    print("o-1:")
    await drain(app)
    print("  ->", await good.aresult(timeout=10))
    bad = await order.aenqueue("o-2", 990, ["atlas"], "Atlantis")
    print("o-2:")
    await drain(app)
    try:
        await bad.aresult(timeout=10)
    except dw.WorkflowFailed as exc:
        print("  ->", exc)
    for step in (await bad.ainfo())["steps"]:
        print(f"  {step['kind']:10} {step['name']:18} {step['status']}")


if __name__ == "__main__":
    asyncio.run(main())
