"""The rate a cluster-wide rate limit achieves across two worker processes.

    python benchmarks/ratelimit.py [--url sqlite:////tmp/x.db] [--jobs 300] [--rate 50]

Enqueues N jobs of a task limited to RATE/s, runs two `dumbwaiter worker`
processes, and reports the achieved start rate (ideally RATE) and the most
starts seen in any one-second window (never above RATE: that is the promise,
tested in tests/integration/test_flow_processes.py).  Uses the flow test app.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--jobs", type=int, default=300)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dw-rate-"))
    url = args.url or f"sqlite:///{tmp}/rate.db"
    log = tmp / "flow.log"
    os.environ.update(FLOWAPP_URL=url, FLOWAPP_LOG=str(log))
    sys.path.insert(0, str(ROOT))
    from tests.apps import flowapp  # 50/s: flow.api_call

    flowapp.api_call.enqueue_many(range(args.jobs))
    cmd = [sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.apps.flowapp:app",
           "-c", "16", "--log-level", "WARNING"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [subprocess.Popen(cmd, cwd=ROOT, env=env) for _ in range(2)]
    try:
        while len(log.read_text().splitlines() if log.exists() else []) < args.jobs:
            time.sleep(0.05)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    starts = sorted(float(line.split()[1]) for line in log.read_text().splitlines())
    worst = max(sum(1 for u in starts[i : i + 200] if u < t + 1.0) for i, t in enumerate(starts))
    span = starts[-1] - starts[0]
    print(f"{args.jobs} jobs limited to 50/s, two worker processes:")
    print(
        f"  {span:.2f} s from first start to last (ideal {(args.jobs - 50) / 50:.2f} s: "
        f"the first 50 may start at once); most starts in any 1 s window: {worst}"
    )


if __name__ == "__main__":
    main()
