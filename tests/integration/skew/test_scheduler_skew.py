"""A scheduler replica on a skewed host leads, dies, and a true one takes over:
no tick runs twice.

Ticks are computed from the leader's wall clock, so a leader 2 s ahead runs
them 2 s early and one 30 s behind runs them 30 s late (docs/guarantees.md,
"Clock skew"); what must hold whatever the clocks is one run per tick.  The
skewed replica (``dumbwaiter scheduler`` under libfaketime) starts first and
leads; once its ticks run it is SIGKILLed, the true replica takes the lock
after it ran out, and runs ticks of its own.  Every tick key in the run log
appears once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.brokers import BROKERS
from tests.integration.skew.agent import ROOT, faketime_library
from tests.integration.skew.test_clock_skew import HOSTED
from tests.integration.test_scheduler_replicas import Runs, _pid, schedapp_env
from tests.waiting import wait_until

pytestmark = pytest.mark.crash

APP = "tests.apps.schedapp:app"
LEASE = 3.0


#: one skew per broker, ahead and behind in turn (the whole product ran past
#: the suite's time budget; the lock itself is tested under all four skews
#: in test_clock_skew.py)
CASES = [
    pytest.param(b, o, id=f"{b}-{o:+g}s")
    for b, o in zip(HOSTED, [2.0, -30.0] * len(HOSTED), strict=False)
]


@pytest.mark.parametrize(("broker", "offset"), CASES)
def test_a_skewed_leader_and_its_successor_run_each_tick_once(
    broker: str, offset: float, tmp_path: Path
) -> None:
    url = BROKERS[broker](tmp_path)
    runs = Runs(tmp_path / "runs.log")
    env = schedapp_env(url, runs)
    skewed_env = {
        **env,
        "LD_PRELOAD": faketime_library(),
        "FAKETIME": f"{offset:+g}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    started: list[subprocess.Popen[bytes]] = []

    def start(cmd_env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "dumbwaiter", *args, "--app", APP, "--log-level", "WARNING"]
        started.append(subprocess.Popen(cmd, cwd=ROOT, env=cmd_env))
        return started[-1]

    try:
        start(env, "worker", "-q", "default", "-c", "8")
        skewed = start(skewed_env, "scheduler", "--lease", str(LEASE))
        wait_until(lambda: skewed.pid in {_pid(b) for b in runs.by()}, "the skewed leader's ticks")
        true = start(env, "scheduler", "--lease", str(LEASE))
        skewed.send_signal(signal.SIGKILL)
        skewed.wait(timeout=10)
        wait_until(
            lambda: sum(1 for b in runs.by() if _pid(b) == true.pid) >= 2,
            "the true replica to lead and its ticks to run",
            timeout=60 + max(0.0, offset),
        )
    finally:
        for p in started:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
    counts = Counter(key for key, _, _ in runs.rows())
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"ticks that ran more than once: {twice}"
