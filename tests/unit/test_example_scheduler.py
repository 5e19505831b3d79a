"""examples/scheduler works as its README says: a worker with a scheduler runs
the heartbeat, and ``dumbwaiter schedules`` lists, pauses and triggers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import dumbwaiter as dw

ROOT = Path(__file__).resolve().parents[2]


def _dumbwaiter(cwd: Path, env: dict[str, str], *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "dumbwaiter", *args, "--app", "jobs:app", "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return orjson.loads(out.stdout)


def _succeeded(cwd: Path, env: dict[str, str], task: str) -> list[dict[str, Any]]:
    page = _dumbwaiter(cwd, env, "jobs", "ls", "-t", task, "-s", "succeeded")
    return list(page["items"])


def _wait_for(what: str, cond: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def test_scheduler_example_runs_as_its_readme_says(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "scheduler" / "jobs.py", tmp_path / "jobs.py")
    env = {k: v for k, v in os.environ.items() if k not in ("DUMBWAITER_URL", "DUMBWAITER_APP")}
    env["PYTHONPATH"] = str(ROOT / "src")  # this checkout's code
    names = {s["name"] for s in _dumbwaiter(tmp_path, env, "schedules", "ls")["schedules"]}
    assert names == {"jobs.heartbeat", "jobs.nightly_report", "cleanup-sessions", "cleanup-audit"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "dumbwaiter", "worker", "--app", "jobs:app", "--with-scheduler",
         "--log-level", "WARNING"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        [beat, *_] = _wait_for("a heartbeat", lambda: _succeeded(tmp_path, env, "jobs.heartbeat"))
        assert beat["key"].startswith("periodic:jobs.heartbeat:")
        triggered = _dumbwaiter(tmp_path, env, "schedules", "trigger", "nightly_report")
        _wait_for("the triggered report", lambda: _succeeded(tmp_path, env, "jobs.nightly_report"))
        assert triggered["name"] == "jobs.nightly_report"
        _dumbwaiter(tmp_path, env, "schedules", "pause", "heartbeat")
        rows = {s["name"]: s for s in _dumbwaiter(tmp_path, env, "schedules", "ls")["schedules"]}
        assert rows["jobs.heartbeat"]["paused"] and rows["jobs.heartbeat"]["last_run"]
        assert rows["cleanup-audit"]["tz"] == "Europe/Paris"
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0
    assert "heartbeat for tick" in out and "nightly report" in out


def test_the_python_blocks_of_docs_scheduler_run_as_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every ```python block of docs/scheduler.md, in order, in one namespace
    (the doctest-style ``>>>`` block shows an error on purpose and is skipped)."""
    monkeypatch.setenv("DUMBWAITER_URL", f"memory://docs-{os.getpid()}")
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "scheduler.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    namespace: dict[str, Any] = {"__name__": "jobs"}
    for block in blocks:
        if block.lstrip().startswith(">>>"):
            continue
        exec(compile(block, "docs/scheduler.md", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, dw.App)
    assert {"cleanup-sessions", "cleanup-audit", "jobs.nightly_report"} <= set(app.schedules)
    with pytest.raises(dw.ConfigurationError, match="unknown time zone"):
        app.periodic(cron="0 3 * * *", tz="Asia/Taipeh")
