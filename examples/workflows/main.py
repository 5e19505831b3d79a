"""Workflows: a chain that passes results on, and a chord that fans in.

    python examples/workflows/main.py

Runs on a throwaway SQLite file with an in-process worker (dw.testing.drain);
in production the same code enqueues and `dumbwaiter worker` runs the steps.
"""

import asyncio
import tempfile

import dumbwaiter as dw
from dumbwaiter.testing import drain

app = dw.App(f"sqlite:///{tempfile.mkdtemp()}/workflows.db")


@app.task
def fetch_order(order_id: str) -> dict:
    return {"id": order_id, "lines": [1200, 350, 99]}


@app.task
def total(order: dict) -> int:
    return sum(order["lines"])


@app.task
def receipt(cents: int) -> str:
    return f"charged {cents / 100:.2f} EUR"


@app.task
async def price_in(currency: str, cents: int) -> str:
    return f"{currency} {cents}"


@app.task
def summary(prices: list[str]) -> str:
    return "; ".join(prices)


async def main() -> None:
    chain = await dw.chain(fetch_order.s("o-1"), total.s(), receipt.s()).aenqueue()
    chord = await dw.chord(
        dw.group(price_in.s(c, 1649) for c in ("EUR", "USD", "TWD")), summary.s()
    ).aenqueue()
    await drain(app)
    print("chain:", await chain.aresult(timeout=10))
    print("chord:", await chord.aresult(timeout=10))
    for step in await chain.asteps():
        print(f"  step {step['path']}: {step['task'].rsplit('.', 1)[-1]} {step['state']}")


if __name__ == "__main__":
    asyncio.run(main())
