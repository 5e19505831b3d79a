"""Publish-to-handle throughput of events with three subscriber groups, on SQLite.

    python benchmarks/events_sqlite.py [--events 5000] [--concurrency 32]

Publishes N events one at a time (each a durable, fsynced commit that logs
the event and fans it out to the three groups' queues), then starts ONE
worker process (`dumbwaiter worker`) and measures how fast it handles the 3N
deliveries: first handler start to last, as the peers harness measures
drain.  Prints publish/s and deliveries handled/s; no peer publishes to
consumer groups this way, so there is no side-by-side row for it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dw-events-") as tmp:
        db, log = Path(tmp) / "events.db", Path(tmp) / "handled.log"
        os.environ["DW_EVENTS_URL"] = f"sqlite:///{db}"
        os.environ["DW_EVENTS_LOG"] = str(log)
        sys.path.insert(0, str(HERE))
        import events_app

        t0 = time.perf_counter()
        for n in range(args.events):
            events_app.app.publish(events_app.OrderCreated(n=n))
        publish_s = time.perf_counter() - t0
        expected = 3 * args.events
        worker = subprocess.Popen(
            [sys.executable, "-m", "dumbwaiter", "worker", "--app", "events_app:app",
             "-c", str(args.concurrency), "--log-level", "WARNING"],
            cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while True:
                lines = log.read_text().splitlines() if log.exists() else []
                if len(lines) >= expected or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            worker.terminate()
            worker.wait(30)
        stamps = sorted(float(line.split()[2]) for line in lines)
        groups = {line.split()[0] for line in lines}
        handled_s = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
        print(f"events published one at a time: {args.events / publish_s:,.0f}/s")
        print(
            f"deliveries handled: {len(lines):,} of {expected:,} ({len(groups)} groups) "
            f"at {len(lines) / handled_s:,.0f}/s by one worker process (-c {args.concurrency})"
        )


if __name__ == "__main__":
    main()
