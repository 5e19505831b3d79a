"""Crash safety of durable workflows: SIGKILL the worker twice, lose nothing.

200 runs of a five-step workflow that sleeps between its second and third
step; the worker process is killed with SIGKILL twice and restarted.  Each
kill is made to find runs in the three places issue 23.3 names: in the
middle of a step (held there, ``durableapp``'s hold file), between two
steps (held right after a step's checkpoint), and during a sleep (no worker
holds those).  Every run must succeed, no step whose checkpoint was stored
at a kill may run after it, each step held mid-run at a kill ran again
(at-least-once) with the same idempotency key, and each run held between
steps went on with its next step without running the one before again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.durable.store import CHECKPOINT, RUN
from tests.brokers import BROKERS, CROSS_PROCESS
from tests.crash import durableapp
from tests.crash.test_sigkill import _killed_on_failure, _lines, _stop, _wait

ROOT = Path(__file__).resolve().parents[2]
RUNS = 200
#: runs each kill must find held mid-step, and as many held between steps
HELD = 3
STEPS = durableapp.STEPS
pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]


def _url(broker: str, tmp_path: Path) -> str:
    url = BROKERS[broker](tmp_path)
    if broker == "nats":
        # jobs a killed worker had pulled but not claimed come back after
        # AckWait (30 s by default): keep the test short
        url += "&ack_wait=5"
    return url


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the worker exited with {proc.returncode}")
    return True


def _records(app: dw.App, prefix: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        found = await app.broker.kv_scan(prefix)
        return {k: __import__("orjson").loads(v) for k, v in found.items()}

    return asyncio.run(go())


def _statuses(app: dw.App) -> dict[str, str]:
    return {r["id"]: r["status"] for r in _records(app, RUN).values()}


def _completed(app: dw.App) -> set[str]:
    """The step keys (run:step) whose checkpoint is stored."""
    out = set()
    for key, ck in _records(app, CHECKPOINT).items():
        if ck.get("k") == "step":
            run = key[len(CHECKPOINT) :].split(":", 1)[0]
            out.add(f"{run}:{ck['n']}")
    return out


def _held(log: Path, pid: int) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(run, step) of the runs worker ``pid`` holds mid-step, and of those it
    holds right after a step (``durableapp``'s held-step / held-between lines)."""
    out: dict[str, set[tuple[str, str]]] = {"held-step": set(), "held-between": set()}
    for line in _lines(log):
        kind, *rest = line.split()
        if kind in out and int(rest[2]) == pid:
            out[kind].add((rest[0], rest[1]))
    return out["held-step"], out["held-between"]


@pytest.mark.parametrize("broker", CROSS_PROCESS)
def test_sigkill_twice_every_run_succeeds_and_no_completed_step_runs_again(
    broker: str, tmp_path: Path
) -> None:
    url = _url(broker, tmp_path)
    log = tmp_path / "steps.log"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this tree's dumbwaiter
    hold = tmp_path / "hold"
    env = {
        **os.environ,
        "DW_CRASH_URL": url,
        "DW_CRASH_LOG": str(log),
        "DW_CRASH_HOLD": str(hold),
        "PYTHONPATH": path,
    }
    app = dw.App(url)
    order = app.workflow(name="crash.order")(durableapp.order.fn)  # what the worker runs
    runs = {order.enqueue(i).id: i for i in range(RUNS)}
    assert len(runs) == RUNS

    cmd = [
        sys.executable, "-m", "dumbwaiter", "worker", "--app", "tests.crash.durableapp:app",
        "-c", "16", "--lease", "2", "--heartbeat", "0.5", "--log-level", "WARNING",
    ]  # fmt: skip
    total = RUNS * len(durableapp.STEPS)
    completed_at_kill: list[set[str]] = []
    #: per kill: the (run, step) held mid-step, the (run, step) held after
    held_at_kill: list[tuple[set[tuple[str, str]], set[tuple[str, str]]]] = []
    for threshold in (total // 4, total // 2):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        with _killed_on_failure(proc):
            _wait(
                lambda t=threshold, p=proc: _alive(p) and len(_lines(log)) >= t,  # type: ignore[misc]
                f"{threshold} steps to start",
            )
            hold.touch()
            _wait(
                lambda p=proc: _alive(p) and all(len(h) >= HELD for h in _held(log, p.pid)),  # type: ignore[misc]
                f"{HELD} runs to hold mid-step and {HELD} between steps",
            )
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        hold.unlink()
        completed_at_kill.append(_completed(app))
        held_at_kill.append(_held(log, proc.pid))
        with log.open("a") as f:
            f.write("KILL\n")
        states = _statuses(app)
        assert "sleeping" in states.values(), "the kill should find runs sleeping"

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    with _killed_on_failure(proc):
        _wait(
            lambda: _alive(proc) and list(_statuses(app).values()).count("succeeded") == RUNS,
            "every run to succeed after the restarts",
        )
    _stop(proc)

    for run_id, i in runs.items():
        assert dw.WorkflowRun(app, run_id).result(timeout=1) == [
            f"{s}-{i}" for s in durableapp.STEPS
        ]
    # every execution of a step, by the kills it came after
    ran: dict[str, list[int]] = defaultdict(list)
    kills = 0
    for line in _lines(log):
        if line == "KILL":
            kills += 1
            continue
        if not line.startswith("step "):
            continue  # a held-step / held-between line
        _, run_id, name, key, _pid = line.split()
        assert key == f"{run_id}:{name}"  # the same idempotency key, attempt after attempt
        ran[key].append(kills)
    assert set(ran) == {f"{r}:{s}" for r in runs for s in durableapp.STEPS}
    again = {k: epochs for k, epochs in ran.items() if len(epochs) > 1}
    for key, epochs in ran.items():
        assert len(epochs) == len(set(epochs)), f"{key} ran twice without a kill in between"
        for e in epochs[1:]:
            assert key not in completed_at_kill[e - 1], f"{key} ran again after it completed"
    assert again, "the kills should find steps running (they run again, at least once)"
    for e, (mid_step, between) in enumerate(held_at_kill, start=1):
        for run_id, name in mid_step:  # running at the kill: run again, after it
            key = f"{run_id}:{name}"
            assert key not in completed_at_kill[e - 1], key
            assert any(k >= e for k in ran[key]), f"{key}, mid-step at kill {e}, never ran again"
        for run_id, name in between:  # stored at the kill: never again; the next one ran
            key = f"{run_id}:{name}"
            assert key in completed_at_kill[e - 1], key
            assert max(ran[key]) < e, f"{key}, stored before kill {e}, ran again"
            following = STEPS[STEPS.index(name) + 1]
            assert f"{run_id}:{following}" not in completed_at_kill[e - 1]
    app.close()
