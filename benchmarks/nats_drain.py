"""W1's drain on NATS, alone: ``benchmarks/rabbitmq_drain.py``'s measure (one
``dumbwaiter worker`` process drains N no-op jobs; the rate and the worker's
CPU per job, by thread) on a NATS namespace of its own, deleted before each
repetition.

    .venv/bin/python benchmarks/nats_drain.py [-n 10000] [-c 32] [--reps 3]

``DW_DRAIN_NATS`` names the server (default ``nats://127.0.0.1:4222``).  Run
it under the benchmarks' flock, from the checkout to measure (the worker runs
the checkout the script is in).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import rabbitmq_drain as drain
from benchmarks.nats_enqueue import _delete

import dumbwaiter as dw

SERVER = os.environ.get("DW_DRAIN_NATS", "nats://127.0.0.1:4222")
PREFIX = "dwdrainnats"
APP = "benchmarks.nats_drain:app"

app = dw.App(f"{SERVER}?prefix={PREFIX}")
app.task(name="noop")(drain.noop.fn)


def _reset() -> None:
    asyncio.run(_delete(SERVER, [PREFIX]))
    drain.DONE.unlink(missing_ok=True)


async def _fill(n: int) -> None:
    a = dw.App(f"{SERVER}?prefix={PREFIX}")
    task = a.task(name="noop")(drain.noop.fn)
    try:
        for start in range(0, n, 1000):
            await task.aenqueue_many(range(start, min(n, start + 1000)))
    finally:
        await a.aclose()


def main() -> None:
    drain.main_for("benchmarks.nats_drain:app", _reset, _fill)


if __name__ == "__main__":
    main()
