"""What holding a batch of encoded envelopes costs the producer, per message.

    .venv/bin/python benchmarks/encode_cost.py

10,000 no-op messages are built once, then encoded and kept in a list (as a
bulk enqueue keeps its batch until it is stored) in each of three ways:
orjson's own result, ``message.encode_checked`` (a small envelope copied out
of orjson's 1 KiB object) and ``encode_checked_text``.  CPU time
(``time.process_time``), best of 7, alternately.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

import dumbwaiter as dw
from dumbwaiter.message import encode_checked, encode_checked_text
from dumbwaiter.task import _NO_OPTIONS

N = 10_000


def main() -> None:
    app = dw.App("memory://")

    @app.task(name="noop")
    def noop(i: int) -> None:
        pass

    msgs = list(noop.messages(range(N), _NO_OPTIONS))
    ways: dict[str, Callable[[], list[object]]] = {
        "orjson's bytes": lambda: [orjson.dumps(m.to_dict()) for m in msgs],
        "encode_checked": lambda: [encode_checked(m, None) for m in msgs],
        "encode_checked_text": lambda: [encode_checked_text(m, None) for m in msgs],
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(7):
        for name, f in ways.items():
            t = time.process_time()
            kept = f()
            best[name] = min(best[name], time.process_time() - t)
            del kept
    for name, s in best.items():
        print(f"{name:>20}: {s / N * 1e6:.2f} us a message")


if __name__ == "__main__":
    main()
