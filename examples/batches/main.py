"""Batch jobs: 100,000 settlements in shards, progress, a callback once, checkpoints.

    python examples/batches/main.py

The items are a generator: they are read as shards are enqueued, never all
held in memory.  `dumbwaiter batches ls` shows the progress from any shell.
"""

import asyncio
import tempfile
from collections.abc import Iterator

import dumbwaiter as dw
from dumbwaiter.testing import drain

app = dw.App(f"sqlite:///{tempfile.mkdtemp()}/batches.db")
settled = 0


def settlements() -> Iterator[dict]:
    for i in range(100_000):
        yield {"id": i, "cents": i % 997}


@app.task(retry=dw.Retry(attempts=3, backoff=0.01))
async def settle(items: list[dict], ctx: dw.Context) -> None:
    """Settle a shard; a retry continues from the last checkpoint."""
    global settled
    start = await ctx.aload_checkpoint() or 0
    for n in range(start, len(items)):
        settled += 1
        if n % 500 == 499:
            await ctx.acheckpoint(n + 1)


@app.task
def nightly_report(summary: dict) -> None:
    print(f"  on_complete: {summary['done']} shards, {summary['items']:,} settlements")


async def main() -> None:
    batch = await app.abatch(
        settle, settlements(), chunk_size=2_000, on_complete=nightly_report.s()
    )
    await drain(app, concurrency=8)
    p = await batch.aprogress()
    print(f"batch {p['id']}: {p['state']}, {p['done']}/{p['total']} shards, settled {settled:,}")


if __name__ == "__main__":
    asyncio.run(main())
