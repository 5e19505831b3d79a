"""W1's drain on SQLite, alone: ``benchmarks/rabbitmq_drain.py``'s measure (one
``dumbwaiter worker`` process drains N no-op jobs; the rate and the worker's
CPU per job, by thread) on a database file of its own, deleted before each
repetition.

    .venv/bin/python benchmarks/sqlite_drain.py [-n 10000] [-c 32] [--reps 3]

``DW_DRAIN_SQLITE`` names the file (default ``/tmp/dwdrain-sqlite.db``).  Run
it under the benchmarks' flock, from the checkout to measure (the worker runs
the checkout the script is in); to compare commits, alternate copies of this
script in each commit's ``git archive``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import rabbitmq_drain as drain

import dumbwaiter as dw

FILE = Path(os.environ.get("DW_DRAIN_SQLITE", "/tmp/dwdrain-sqlite.db"))
URL = f"sqlite:///{FILE}"

app = dw.App(URL)
app.task(name="noop")(drain.noop.fn)


def _reset() -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{FILE}{suffix}").unlink(missing_ok=True)
    drain.DONE.unlink(missing_ok=True)


async def _fill(n: int) -> None:
    a = dw.App(URL)
    task = a.task(name="noop")(drain.noop.fn)
    try:
        for start in range(0, n, 1000):
            await task.aenqueue_many(range(start, min(n, start + 1000)))
    finally:
        await a.aclose()


def main() -> None:
    drain.main_for("benchmarks.sqlite_drain:app", _reset, _fill)


if __name__ == "__main__":
    main()
