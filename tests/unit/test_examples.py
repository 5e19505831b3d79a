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


def _run_example(name: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name / "main.py")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout


def test_workflows_example() -> None:
    out = _run_example("workflows")
    assert "chain: charged 16.49 EUR" in out and "chord: EUR 1649; USD 1649; TWD 1649" in out


def test_flow_control_example() -> None:
    out = _run_example("flow_control")
    assert "peak concurrent exports per tenant: {'acme': 2, 'globex': 2}" in out
    assert "rebuild enqueued twice -> one job: True; digest: True" in out
    assert out.count("reindexed doc-1 once") == 1


def test_batches_example() -> None:
    out = _run_example("batches")
    assert "complete, 50/50 shards" in out  # a retried shard may settle some items again
    assert out.count("on_complete:") == 1


def test_events_example() -> None:
    out = _run_example("events")
    assert "email:   receipt for o-0 (950 cents)" in out  # upgraded from version 1
    assert "analytics (replayed): o-1" in out and "analytics (replayed): o-0" in out


def test_fastapi_example() -> None:
    """The receipt goes through dumbwaiter.mail, the partner's webhook through
    dumbwaiter.webhooks to a receiver that verifies its signature."""
    out = _run_example("fastapi")
    assert "enqueued: ['event', 'receipt_job']" in out and "analytics: o-1" in out
    assert "mail: sent to ann@example.com" in out
    assert "mail subject: Your order o-1 | Thank you! Order o-1: 12.99 EUR." in out
    assert out.count("webhook received, signature verified: msg_") == 1, out
    assert '"type":"order.created"' in out and '"total_cents":1299' in out
    assert "endpoint: 1 delivered, breaker closed" in out
    assert "dashboard: 200 True" in out


def test_flask_example() -> None:
    out = _run_example("flask")
    assert "enqueued: 201 ['invoice_job', 'receipt_job']" in out
    assert "invoice: invoice o-1: 12.99 EUR" in out


def test_django_example() -> None:
    """The committed order's two jobs run; the declined order's never do."""
    out = _run_example("django")
    assert "committed order: ['receipt', 'total'] | rolled back order: 402" in out
    assert "drained: 2 succeeded, 0 retried, 0 dead" in out
    assert "total: SUCCESSFUL 1299" in out
