"""Flow control: a rate limit, per-tenant concurrency, unique jobs, debounce.

    python examples/flow_control/main.py

Every limit is cluster-wide (kept in the broker), so it holds across worker
processes and machines.  A job over a limit waits without using an attempt.
"""

import asyncio
import tempfile
import time
from datetime import timedelta

import dumbwaiter as dw
from dumbwaiter.testing import drain

app = dw.App(f"sqlite:///{tempfile.mkdtemp()}/flow.db")
starts: list[float] = []
running: dict[str, int] = {}
peak: dict[str, int] = {}


@app.task(rate_limit="20/s")  # a partner API allows 20 calls a second
async def call_partner(n: int, ctx: dw.Context) -> None:
    starts.append(ctx.started_at)


@app.task(concurrency=2, limit_key=lambda args: args["tenant"])  # fair between tenants
async def export(tenant: str, n: int) -> None:
    running[tenant] = running.get(tenant, 0) + 1
    peak[tenant] = max(peak.get(tenant, 0), running[tenant])
    await asyncio.sleep(0.02)
    running[tenant] -= 1


@app.task(unique=True)  # no second rebuild of an index while one is queued or running
def rebuild(index: str) -> None: ...


@app.task(unique=timedelta(minutes=10))  # at most one digest per user in 10 minutes
def digest(user_id: int) -> None: ...


@app.task(debounce=0.2)  # a burst of edits reindexes once, after the burst
def reindex(doc: str) -> None:
    print(f"  reindexed {doc} once")


async def main() -> None:
    t0 = time.time()
    await call_partner.aenqueue_many(range(50))
    await export.aenqueue_many([(t, i) for t in ("acme", "globex") for i in range(6)])
    a, b = await rebuild.aenqueue("products"), await rebuild.aenqueue("products")
    c, d = await digest.aenqueue(7), await digest.aenqueue(7)
    for _ in range(5):
        await reindex.aenqueue("doc-1")
    await drain(app, concurrency=16)
    span = max(starts) - min(starts)
    print(f"50 partner calls over {span:.1f} s (20/s allows no faster than ~2 s)")
    print(f"peak concurrent exports per tenant: {dict(sorted(peak.items()))}")
    print(f"rebuild enqueued twice -> one job: {a.id == b.id}; digest: {c.id == d.id}")
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
