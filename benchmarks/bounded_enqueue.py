"""What a bound costs a producer: one job per call into a bounded queue
(``Broker.enqueue_bounded``) against a plain ``enqueue``, per broker.

One producer, calls one after another, N jobs each way (after 20 warm-up
calls); the bounded queue's limit is never reached, so every call is
admitted.  Its queue holds the jobs of the calls before it (nothing drains
them), which is what the lock path's count reads on engines that count
their stored records.

    PYTHONPATH=src:. python benchmarks/bounded_enqueue.py sqlite redis ...
    N=100 PYTHONPATH=src:. python benchmarks/bounded_enqueue.py kafka

Broker names are those of tests/brokers.py (each gets a fresh namespace).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from tests.brokers import BROKERS

from dumbwaiter.brokers import from_url
from dumbwaiter.message import TASK, Message, uuid7

BOUND = {"bounded": 10**9}


def _msg(queue: str) -> Message:
    return Message(
        id=uuid7(), kind=TASK, name="t", queue=queue, args=[], created_at=time.time(),
        max_attempts=4,
    )  # fmt: skip


async def measure(url: str, n: int) -> dict[str, float]:
    """Microseconds per call, plain and bounded."""
    b = from_url(url)
    await b.open()
    try:
        out: dict[str, float] = {}
        for queue in ("plain", "bounded"):

            async def send(q: str = queue) -> None:
                if q == "bounded":
                    await b.enqueue_bounded([_msg(q)], BOUND)
                else:
                    await b.enqueue([_msg(q)])

            for _ in range(20):
                await send()
            t = time.perf_counter()
            for _ in range(n):
                await send()
            out[queue] = (time.perf_counter() - t) / n * 1e6
        return out
    finally:
        await b.close()


def main() -> None:
    n = int(os.environ.get("N", "300"))
    for name in sys.argv[1:]:
        r = asyncio.run(measure(BROKERS[name](Path(tempfile.mkdtemp())), n))
        native = (
            "native"
            if from_url(BROKERS[name](Path(tempfile.mkdtemp()))).capabilities.native_capacity
            else "lock"
        )
        print(f"{name:18s} {native:6s} plain {r['plain']:8.0f} us  bounded {r['bounded']:8.0f} us")


if __name__ == "__main__":
    main()
