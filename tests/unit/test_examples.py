"""The README's first task works as written (examples/quickstart/tasks.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_as_the_readme_says(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "quickstart" / "tasks.py", tmp_path / "tasks.py")
    env = {k: v for k, v in os.environ.items() if k != "DUMBWAITER_URL"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dumbwaiter",
            "worker",
            "--app",
            "tasks:app",
            "--log-level",
            "WARNING",
        ],
        cwd=tmp_path,
        env=env,
    )
    try:
        out = subprocess.run(
            [sys.executable, "tasks.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    job_id, status = out.stdout.split()[:2]
    assert len(job_id) == 36 and status in ("ready", "running", "succeeded")
    assert "welcome mail sent to user 42" in out.stdout
    assert (tmp_path / "dumbwaiter.db").exists()
